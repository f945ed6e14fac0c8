"""What the API returns: per-request outputs, streaming deltas and metrics (vLLM's shapes)."""

from __future__ import annotations

from dataclasses import dataclass, field

from engine.logprobs import Logprob


@dataclass
class RequestMetrics:
    """Speculation counters of one sample (or summed over a request's ``n`` samples).

    ``num_drafted``: draft tokens sent to verification; ``num_accepted``: those accepted;
    ``num_steps``: engine steps that produced tokens; ``num_preemptions``: times its KV cache was
    dropped and recomputed.
    """

    num_drafted: int = 0
    num_accepted: int = 0
    num_steps: int = 0
    num_generated: int = 0
    num_preemptions: int = 0
    arrival_time: float = 0.0
    first_token_time: float | None = None
    finished_time: float | None = None

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted (0 when nothing was drafted)."""
        return self.num_accepted / self.num_drafted if self.num_drafted else 0.0

    @property
    def mean_accepted_length(self) -> float:
        """Tokens appended per step (accepted drafts + the recovered or bonus token)."""
        return self.num_generated / self.num_steps if self.num_steps else 0.0

    def add(self, other: RequestMetrics) -> None:
        """Sum another sample's counters into this one (for ``n > 1``)."""
        self.num_drafted += other.num_drafted
        self.num_accepted += other.num_accepted
        self.num_steps += other.num_steps
        self.num_generated += other.num_generated
        self.num_preemptions += other.num_preemptions


@dataclass
class CompletionOutput:
    """One sample of a request.

    ``finish_reason``: ``stop`` (EOS, a stop token or a stop string), ``length`` (``max_tokens``
    or the context length), ``abort`` or ``error``; None while running. ``stop_reason``: the stop
    string or stop token id that ended it (None for EOS or length). ``logprobs``: one dict per
    token, ``{token_id: Logprob}`` holding the chosen token and the top ``logprobs`` ones (what
    the values are: ``EngineConfig.logprobs_mode``, :mod:`engine.logprobs`); None when not
    requested. ``text`` is empty with ``SamplingParams(detokenize=False)``.
    """

    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    logprobs: list[dict[int, Logprob]] | None = None
    cumulative_logprob: float | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    """A request's prompt and its ``n`` samples; ``error`` says why a request failed alone.
    ``prompt_logprobs``: with ``SamplingParams(prompt_logprobs=n)``, None for the first prompt
    token then one ``{token_id: Logprob}`` per prompt token (raw model values)."""

    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput]
    finished: bool
    metrics: RequestMetrics = field(default_factory=RequestMetrics)
    error: str | None = None
    prompt_logprobs: list[dict[int, Logprob] | None] | None = None
    num_cached_tokens: int = 0


@dataclass
class StreamDelta:
    """New text of one sample since the previous delta (``generate_stream``).

    Text is held back while it could still be the start of a stop string, so no character past a
    stop is ever streamed. The last delta of a sample has ``finish_reason`` set, and ``error``
    says why when that is ``error``.
    """

    request_id: str
    index: int
    text: str
    token_ids: list[int]
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    error: str | None = None

    @property
    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class EngineMetrics:
    """Engine-wide counters since the engine started (or the last ``reset_metrics``).

    ``acceptance_rate``: accepted / drafted tokens. ``mean_accepted_length``: tokens appended per
    request-step while speculating (accepted + 1). ``acceptance_per_position[i]``: accepted /
    drafted at draft position ``i``. ``token_acceptance`` (alpha): accepted / tested drafts, where
    a draft is tested when no earlier draft of its step was rejected; it is the per-token acceptance
    probability of Leviathan et al. ``draft_cost_ratio`` (c): time of one draft step / time of one
    target step, measured. ``predicted_speedup``: Leviathan et al. (arXiv 2211.17192, eq. 1)
    ``(1 - alpha^(k+1)) / ((1 - alpha) (k c + 1))`` with the mean k drafted per step.
    ``measured_speedup``: ``tokens_per_s`` / the no-speculation baseline, when one is known.
    ``prefix_cache_queries`` / ``prefix_cache_hits`` (vLLM's counters): context tokens looked
    up in the prefix cache at admission, and those found; ``prefix_cache_tokens``: the KV rows
    the cache holds now.
    """

    num_requests: int = 0
    num_generated: int = 0
    num_drafted: int = 0
    num_accepted: int = 0
    num_tested: int = 0
    num_steps: int = 0
    num_spec_request_steps: int = 0
    num_preemptions: int = 0
    elapsed_s: float = 0.0
    acceptance_rate: float = 0.0
    token_acceptance: float = 0.0
    mean_accepted_length: float = 0.0
    acceptance_per_position: list[float] = field(default_factory=list)
    mean_k: float = 0.0
    draft_cost_ratio: float = 0.0
    tokens_per_s: float = 0.0
    predicted_speedup: float | None = None
    measured_speedup: float | None = None
    baseline_tokens_per_s: float | None = None
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    prefix_cache_tokens: int = 0

    @property
    def prefix_cache_hit_rate(self) -> float:
        """Hits / queries (0 before any lookup)."""
        return self.prefix_cache_hits / self.prefix_cache_queries if self.prefix_cache_queries \
            else 0.0
