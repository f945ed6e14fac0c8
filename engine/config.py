"""Engine and speculation settings: dataclasses that check themselves.

``SpeculativeConfig`` takes vLLM's names (``method``, ``num_speculative_tokens``,
``prompt_lookup_min`` / ``prompt_lookup_max``, ``acceptance_method``, ``posterior_threshold``,
``posterior_alpha``, ``draft_sample_method``) plus the adaptive-k knobs described in
:mod:`scheduler.goodput`. Every bad value raises ``ValueError`` naming the field, the value
and the allowed range; ``from_dict`` rejects unknown keys. ``method`` and ``acceptance_method``
accept every name registered in :mod:`proposers.registry` and :mod:`samplers.registry`.
"""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.logprobs import LOGPROBS_MODES
from proposers import available_proposers
from proposers.ngram_table import MAX_N
from proposers.speculators_dir import SUPPORTED_TYPES as SPECULATORS_TYPES
from proposers.speculators_dir import speculators_type
from samplers import MAX_SPEC_LEN, available_samplers

DRAFT_SAMPLE_METHODS = ("probabilistic", "greedy")
# The names of engine.runner.loader.DTYPES, here so that the CLI's --help needs no transformers.
DTYPES = ("auto", "float32", "bfloat16", "float16")
# how attention reads the KV cache (engine.runner.kv_cache.ATTENTION_BACKENDS lists the same)
ATTENTION_BACKENDS = ("auto", "gather", "paged")
# a ``model`` given with these is a mistake
METHODS_WITHOUT_MODEL = ("ngram", "early_exit", "suffix")
MAX_DEFAULT_THREADS = 16  # the most threads default_num_threads chooses


# draft heads: read the target's embedding and head
HEAD_METHODS = ("eagle", "ngram_eagle", "suffix_eagle", "eagle3")
TREE_METHODS = HEAD_METHODS  # the proposers that draft trees
TP_REFUSED = ("early_exit",)  # (runs the target's split layers)


def tree_size(branching: list[int], depth: int) -> int:
    """Nodes of a full draft tree of ``depth`` levels, ``branching[d]`` children per node at
    level ``d`` (1 past the list's end)."""
    total, width = 0, 1
    for d in range(depth):
        width *= branching[d] if d < len(branching) else 1
        total += width
    return total


def default_num_threads(environ: dict[str, str] | None = None,
                        cpus: set[int] | None = None,
                        topology: Path = Path("/sys/devices/system/cpu")) -> int:
    """torch's CPU threads when ``EngineConfig.num_threads`` is None, so that the engine does not
    oversubscribe the CPU (as vLLM's CPU backend chooses): ``OMP_NUM_THREADS`` when it is set
    to an integer >= 1; else the physical cores among the CPUs this process may run on
    (``os.sched_getaffinity``; hyperthreads of one core count once), less one left to the
    Python host work and the server's other process, at least 1 and at most
    ``MAX_DEFAULT_THREADS``."""
    environ = os.environ if environ is None else environ
    given = environ.get("OMP_NUM_THREADS", "").strip()
    if given.isdigit() and int(given) >= 1:
        return int(given)
    if cpus is None:
        cpus = os.sched_getaffinity(0) if hasattr(os, "sched_getaffinity") else set(
            range(os.cpu_count() or 1))
    cores = set()
    for cpu in cpus:
        try:
            core = tuple((topology / f"cpu{cpu}" / "topology" / key).read_text().strip()
                         for key in ("physical_package_id", "core_id"))
        except OSError:  # (no sysfs: every CPU a core)
            core = ("cpu", str(cpu))
        cores.add(core)
    return max(1, min(len(cores) - 1, MAX_DEFAULT_THREADS))


def _fail(cls: str, name: str, value: object, allowed: str) -> None:
    raise ValueError(f"{cls}.{name}={value!r} is invalid: allowed {allowed}")


def _max_memory(value: Any, device: str) -> dict[Any, Any] | None:
    """accelerate's ``max_memory``: GPU index (an int, or its digits from JSON or YAML) or
    ``cpu`` -> a size (bytes, or a string such as ``"10GiB"``)."""
    if value is None:
        return None
    allowed = "None or a mapping {gpu index or 'cpu': size}, e.g. {0: '10GiB', 'cpu': '60GiB'}"
    if not isinstance(value, dict) or not value:
        _fail("EngineConfig", "max_memory", value, allowed)
    if device != "auto":
        _fail("EngineConfig", "max_memory", value, f"None with device={device!r} (it caps "
              "device='auto' placement)")
    out: dict[Any, Any] = {}
    for key, size in value.items():
        key = int(key) if isinstance(key, str) and key.isdigit() else key
        if not (key == "cpu" or _is_int(key) and key >= 0) or not (
                _is_int(size) and size > 0 or isinstance(size, str) and size):
            _fail("EngineConfig", "max_memory", value, allowed)
        out[key] = size
    return out


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value == value


def field_names(cls: type) -> list[str]:
    """The init fields of a dataclass, in declaration order."""
    return [f.name for f in dataclasses.fields(cls) if f.init]


def check_keys(where: str, data: dict[str, Any], allowed: list[str]) -> None:
    """Raise ``ValueError`` naming the first key of ``data`` that is not in ``allowed``."""
    for key in data:
        if key not in allowed:
            raise ValueError(f"unknown key {key!r} in {where}; allowed: {', '.join(allowed)}")


def infer_method(model: Any) -> str:
    """vLLM's rule for a ``speculative_config`` without ``method``: ``eagle`` when ``model`` is
    a draft head's directory (``DraftHead.save`` writes its ``draft_head.json``), the
    ``speculators_model_type`` of a speculators head's ``config.json`` (``eagle3``), else
    ``draft_model``; no ``model`` is an error naming ``method``."""
    if model is None:
        _fail("SpeculativeConfig", "method", None, f"one of {' | '.join(available_proposers())}"
              " (or give model, a draft model or a draft head's directory, to infer it)")
    from proposers.head_model import CONFIG_NAME as HEAD_CONFIG_NAME  # (imports torch)

    if isinstance(model, (str, os.PathLike)) and (Path(model) / HEAD_CONFIG_NAME).is_file():
        return "eagle"
    kind = speculators_type(model) if isinstance(model, (str, os.PathLike)) else None
    if kind is not None:  # (a speculators head: its type names the method, as vLLM reads it)
        if kind not in SPECULATORS_TYPES:
            _fail("SpeculativeConfig", "model", str(model), "a speculators head of "
                  f"speculators_model_type {' | '.join(SPECULATORS_TYPES)}, not {kind!r}")
        return kind
    return "draft_model"


@dataclass
class SpeculativeConfig:
    """How drafts are proposed and verified.

    ``method``: ``ngram`` (prompt lookup), ``draft_model`` (a small HF model given by ``model``:
    a name or path, or a loaded model with its ``tokenizer``), ``eagle`` / ``ngram_eagle`` (a
    draft head: ``model`` is a directory saved by ``DraftHead.save``, None: the shipped head),
    ``eagle3`` (an EAGLE-3 head in the speculators format: ``model`` is its directory) or
    ``early_exit`` (the target's first ``num_early_exit_layers`` layers). None (as in vLLM):
    inferred from ``model``, ``eagle`` for a draft head's directory, the
    ``speculators_model_type`` of a speculators directory, else ``draft_model``; with no
    ``model`` either it is an error (vLLM has no default method).
    ``acceptance_method``: ``rejection_sampler`` (lossless), ``greedy`` (strict argmax match,
    lossless for temperature 0) or ``typical_acceptance_sampler`` (Medusa, lossy).
    ``adaptive_k``: the goodput controller chooses each step's drafts (0 up to
    ``num_speculative_tokens``) for the most expected tokens per second, from measured step
    costs and each request's acceptance (:mod:`scheduler.goodput`); off: every step drafts
    ``num_speculative_tokens``. Seeded sampling requests are steered like the others: their
    tokens do not depend on how many drafts a step verifies (``samplers.keyed_random``).
    ``adaptive_guard`` (with ``adaptive_k``): drafting at a batch size backs off to plain steps
    when its realised tokens per second fall below plain decoding's, measured on this engine
    (:mod:`scheduler.payoff_guard`); off: the controller's model alone decides.
    ``verify_cost_per_token``: fixes the cost of scoring one more token per sequence, as a
    fraction of a plain decode step, instead of measuring it (None: measured per batch size).
    ``draft_cost_ratio``: fixes the cost of one draft step / one plain target step (None:
    measured).
    ``adaptive_probe_interval``: the longest wait, in steps, between two probes while drafting
    does not pay (a probe drafts anyway, to see whether acceptance came back; cheap probes come
    sooner).
    ``draft_tree``: draft a *tree* instead of a chain (methods ``eagle`` and ``ngram_eagle``,
    for the draft head's drafts): the number of candidates per node at each depth, e.g.
    ``[3, 2]``: the head's 3 likeliest first drafts, the 2 likeliest second drafts after each,
    then one per node down to ``num_speculative_tokens`` (3 + 6 + 6 + 6 = 21 nodes at k = 4).
    One target forward verifies every node (each sees only its own branch) and one branch is
    kept: greedy, the longest the target agrees with; sampled, by multi-candidate rejection
    (lossless, :mod:`samplers.tree_verify`). Greedy requests without penalties, biases or
    logprobs, in steps of at most 2 sequences, get trees; the others get the chain of the
    likeliest drafts. With ``adaptive_guard`` a step drafts trees only where trees measured
    more tokens per second than chains at its batch size (:mod:`scheduler.tree_gate`). None:
    chains.
    ``suffix_decoding_*`` (vLLM's options, methods ``suffix`` and ``suffix_eagle``,
    :mod:`proposers.suffix`): the longest match + draft (``max_tree_depth``), the requests
    kept after they leave (``max_cached_requests``), drafts per matched token
    (``max_spec_factor``) and the path probability below which drafting stops
    (``min_token_prob``).
    ``draft_tree_sampling``: unseeded sampled requests (under the rejection sampler) get trees
    too, verified by multi-candidate rejection. Off by default: sampled trees are slower than
    chains, for the sampled tree verification's host work (docs/history.md, "Draft trees").
    """

    method: str | None = None
    model: Any = None
    tokenizer: Any = None
    num_speculative_tokens: int = 4
    prompt_lookup_min: int = 1
    prompt_lookup_max: int = 4
    num_early_exit_layers: int | None = None
    acceptance_method: str = "rejection_sampler"
    posterior_threshold: float = 0.09
    posterior_alpha: float = 0.3
    draft_sample_method: str = "probabilistic"
    adaptive_k: bool = True
    adaptive_guard: bool = True
    verify_cost_per_token: float | None = None
    draft_cost_ratio: float | None = None
    adaptive_probe_interval: int = 32
    draft_tree: list[int] | None = None
    draft_tree_sampling: bool = False
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 10000
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1

    def __post_init__(self) -> None:
        name = "SpeculativeConfig"
        if self.method is None:
            self.method = infer_method(self.model)
        if self.method not in available_proposers():
            _fail(name, "method", self.method, " | ".join(available_proposers()))
        if self.method in METHODS_WITHOUT_MODEL and self.model is not None:
            _fail(name, "model", self.model, f"None with method={self.method!r} (it drafts "
                  "without a model); drop method to infer it from model")
        if self.method == "draft_model" and self.model is None:
            _fail(name, "model", None, "a draft model (hub id, path or loaded model) when "
                  "method='draft_model'")
        if self.method == "eagle3" and self.model is None:
            _fail(name, "model", None, "a speculators EAGLE-3 head's directory when "
                  "method='eagle3'")
        k = self.num_speculative_tokens
        if not _is_int(k) or not 0 <= k <= MAX_SPEC_LEN:
            _fail(name, "num_speculative_tokens", k, f"an integer in [0, {MAX_SPEC_LEN}]")
        lo, hi = self.prompt_lookup_min, self.prompt_lookup_max
        if not _is_int(lo) or lo < 1:
            _fail(name, "prompt_lookup_min", lo, "an integer >= 1")
        if not _is_int(hi) or not lo <= hi <= MAX_N:
            _fail(name, "prompt_lookup_max", hi,
                  f"an integer in [prompt_lookup_min={lo}, {MAX_N}]")
        n = self.num_early_exit_layers
        if n is not None and (not _is_int(n) or n < 1):
            _fail(name, "num_early_exit_layers", n, "None or an integer >= 1")
        if self.acceptance_method not in available_samplers():
            _fail(name, "acceptance_method", self.acceptance_method,
                  " | ".join(available_samplers()))
        if not _is_number(self.posterior_threshold) or not 0 < self.posterior_threshold <= 1:
            _fail(name, "posterior_threshold", self.posterior_threshold, "(0, 1]")
        if not _is_number(self.posterior_alpha) or not 0 < self.posterior_alpha <= 1:
            _fail(name, "posterior_alpha", self.posterior_alpha, "(0, 1]")
        if self.draft_sample_method not in DRAFT_SAMPLE_METHODS:
            _fail(name, "draft_sample_method", self.draft_sample_method,
                  " | ".join(DRAFT_SAMPLE_METHODS))
        if not isinstance(self.adaptive_k, bool):
            _fail(name, "adaptive_k", self.adaptive_k, "True or False")
        if not isinstance(self.adaptive_guard, bool):
            _fail(name, "adaptive_guard", self.adaptive_guard, "True or False")
        v = self.verify_cost_per_token
        if v is not None and (not _is_number(v) or not 0 <= v <= 2):
            _fail(name, "verify_cost_per_token", v, "None (measured) or a number in [0, 2]")
        c = self.draft_cost_ratio
        if c is not None and (not _is_number(c) or not 0 <= c <= 10):
            _fail(name, "draft_cost_ratio", c, "None (measured) or a number in [0, 10]")
        p = self.adaptive_probe_interval
        if not _is_int(p) or p < 1:
            _fail(name, "adaptive_probe_interval", p, "an integer >= 1")
        self._check_tree()
        if not isinstance(self.draft_tree_sampling, bool):
            _fail(name, "draft_tree_sampling", self.draft_tree_sampling, "True or False")
        self._check_suffix()

    def _check_suffix(self) -> None:
        name = "SpeculativeConfig"
        depth = self.suffix_decoding_max_tree_depth
        if not _is_int(depth) or not 2 <= depth <= 1024:
            _fail(name, "suffix_decoding_max_tree_depth", depth, "an integer in [2, 1024]")
        cached = self.suffix_decoding_max_cached_requests
        if not _is_int(cached) or cached < 0:
            _fail(name, "suffix_decoding_max_cached_requests", cached, "an integer >= 0")
        factor = self.suffix_decoding_max_spec_factor
        if not _is_number(factor) or not 0 < factor <= 64:
            _fail(name, "suffix_decoding_max_spec_factor", factor, "a number in (0, 64]")
        prob = self.suffix_decoding_min_token_prob
        if not _is_number(prob) or not 0 <= prob <= 1:
            _fail(name, "suffix_decoding_min_token_prob", prob, "a number in [0, 1]")

    def _check_tree(self) -> None:
        tree = self.draft_tree
        if tree is None:
            return
        from engine.runner.step_layout import MAX_TREE_NODES  # (imports torch)

        allowed = (f"None or a list of 1 to num_speculative_tokens="
                   f"{self.num_speculative_tokens} integers >= 1 (candidates per node at each "
                   f"depth) with at most {MAX_TREE_NODES} nodes in all")
        if (not isinstance(tree, list | tuple) or not tree
                or not all(_is_int(b) and b >= 1 for b in tree)):
            _fail("SpeculativeConfig", "draft_tree", tree, allowed)
        if self.method not in TREE_METHODS:
            _fail("SpeculativeConfig", "draft_tree", tree,
                  f"None with method={self.method!r} (trees: {' | '.join(TREE_METHODS)})")
        self.draft_tree = list(tree)
        if len(tree) > self.num_speculative_tokens or tree_size(
                self.draft_tree, self.num_speculative_tokens) > MAX_TREE_NODES:
            _fail("SpeculativeConfig", "draft_tree", tree, allowed)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> SpeculativeConfig:
        """Build from a mapping (a YAML section, or the ``speculative_config=`` dict)."""
        if not isinstance(data, dict):
            raise ValueError(f"speculative_config must be a mapping, got {type(data).__name__}")
        check_keys(cls.__name__, data, field_names(cls))
        return cls(**data)


@dataclass
class EngineConfig:
    """Which model runs where, and the batch and memory limits.

    ``model``: hub id, local directory, ``.gguf`` file, the alias ``smollm2-135m``, or an already
    loaded HF causal LM (then ``tokenizer`` must be given too).
    ``max_num_seqs``: sequences decoded together (each of ``n`` samples counts).
    ``max_num_batched_tokens``: token budget of one forward (prefill chunks + k+1 per decode);
    8192 by default, vLLM's serving default on large GPUs: a prefill too large for a CUDA graph
    bucket runs eagerly, and an eager forward's host time hardly grows with its tokens, so fewer,
    larger chunks bring the first token sooner (docs/performance.md, "One prefill chunk of 8,192
    tokens").
    ``max_model_len``: prompt + output limit; None = the model's own.
    ``kv_cache_tokens``: tokens the KV cache holds over all sequences; None = enough for
    ``max_num_seqs`` full-length sequences, capped on CUDA by ``gpu_memory_utilization`` and on
    CPU at 16384 tokens (preemption starts when it is full).
    ``gpu_memory_utilization`` (vLLM's): the share of the GPU's memory the engine may fill, the
    weights included; the KV cache gets what is left of it after the weights and a reserve for
    activations and CUDA graphs.
    ``seed``: seeds the engine's own random generator, used by requests without a seed of their
    own (torch's global RNG is never touched; None: use it). Sampled output repeats from run to
    run for a request with its own ``SamplingParams.seed`` (it keeps its k); from the engine seed
    alone only with ``adaptive_k`` off, since the controller's k follows measured step times (as
    in vLLM, where the per-request seed is what makes a sample reproducible).
    ``logprobs_mode`` (vLLM's): what ``logprobs`` hold: ``raw_logprobs`` (the model's, before
    any processing), ``processed_logprobs`` (the sampled distribution), or ``raw_logits`` /
    ``processed_logits`` (see :mod:`engine.logprobs`).
    ``trust_remote_code`` (vLLM's, Hugging Face's): allow a hub model's own modelling code.
    ``device``: ``auto`` (the visible GPUs: one GPU holds the whole model; over several, the
    layers are spread with accelerate's ``device_map="auto"``, each KV pool beside its layer),
    ``cpu``, ``cuda`` or ``cuda:N``. ``max_memory`` (accelerate's, with ``device="auto"`` only):
    ``{gpu index or "cpu": size}`` caps what the weights may take on each device, e.g.
    ``{0: "10GiB", "cpu": "60GiB"}``; a model past the caps runs its last layers from CPU memory.
    ``tensor_parallel_size`` (vLLM's): ranks of transformers' tensor-parallel plan, one process per
    GPU launched with ``torchrun --nproc-per-node N`` (:mod:`engine.runner.tensor_parallel`): rank
    0 runs the engine, the others replay its steps; ``LLM(...)`` on a rank > 0 serves rank 0 and
    ends its process when rank 0 exits.
    ``enforce_eager``: run every forward eager. By default (vLLM's too), on one CUDA device the
    decode and verification forwards of the target and of a draft model replay CUDA graphs
    (:mod:`engine.runner.cuda_graphs`), and so do prompt chunks of up to 8 sequences and 1024
    padded tokens; larger prefills run eager.
    ``fused_ops``: on CUDA, the model's LLaMA-form RMSNorms and rotary embedding run as one Triton
    kernel each (:mod:`engine.runner.fused_ops`: a decode step of a small batch is bound by its
    number of kernels); False runs transformers' own operations.
    ``attention_backend``: how attention reads the KV cache. ``paged``: attention reads the pool
    in place through the slot table (:mod:`engine.runner.paged_attention`), a Triton kernel on
    CUDA (with split-K for small batches), inside CUDA graphs too; on CPU its PyTorch reference
    runs (it gathers: for checking the wiring, not for speed); needs an ``sdpa`` model on one
    device and ``tensor_parallel_size=1``. ``gather``: each layer copies the batch's cached keys
    and values out of the token pool, padded to the longest sequence, and SDPA reads them under
    a 4-D mask. ``auto`` (the default): ``paged`` where it runs on a CUDA device, else
    ``gather`` (measurements: docs/performance.md, "Paged attention against the gather").
    ``num_threads``: torch's CPU threads in the engine's process; None: :func:`default_num_threads`
    (``OMP_NUM_THREADS`` when set, else the physical cores this process may run on less one).
    ``structured_forced_tokens``: for a request under a grammar (``structured_outputs``), at
    most this many tokens the grammar forces are verified as drafts in a step, with or without
    a speculative method (0: none; :mod:`engine.grammar_steps`).
    ``enable_prefix_caching`` (vLLM's): a finished, aborted or preempted sequence's committed
    tokens keep their KV rows in a radix tree (:mod:`engine.runner.prefix_cache`), and a later
    prompt that starts with them computes only the rest (evicted least recently used first
    when rows run short). Off by default: see docs/design.md, "Prefix caching".
    ``deterministic``: every token's logits bitwise the same whatever else a step computes
    (its batch, its drafts, a tree, a prefill chunk's split), so greedy speculation gives
    plain decoding's output bit for bit on a GPU in bf16 too, and seeded samples do not depend
    on the batch: the target's matrix products run a batch-invariant Triton kernel
    (:mod:`engine.runner.invariant_matmul`), attention the paged kernel in its chain order
    (one split; a tree node's keys where a chain token's lie), RMSNorm and rotary the fused
    kernels (one row per program).
    Needs a CUDA device (on CPU: Triton's interpreter, ``TRITON_INTERPRET=1``), paged attention
    (``auto`` or ``paged``), ``fused_ops`` and ``tensor_parallel_size=1``. Costs speed: see
    docs/performance.md, "Deterministic mode".
    ``async_scheduling`` (vLLM's): overlap the host's work with the device's. A step of plain
    decoding is launched before the step before it has brought its tokens back (they are fed
    to it on the device), and the host appends, stop-checks and streams those tokens while the
    device runs it (:mod:`engine.overlap`); the output is the synchronous step's. It applies to
    steps where every sequence decodes one token without a grammar, logprobs, penalties, bias,
    bad words or min-tokens; other steps run synchronously. With speculation, the steps the
    controller plans without drafts (a backed-off batch, requests that never draft) overlap,
    and so do a draft head's chain steps (the head drafts the next step on the device from the
    verified tokens); drafting steps whose drafts come from the host (n-gram, a draft model,
    trees) are synchronous. None (the default): on for a CUDA engine; True also on CPU
    (where the forward runs in the call, so nothing overlaps: for tests);
    ``tensor_parallel_size > 1`` does not overlap yet.
    """

    model: Any = "smollm2-135m"
    tokenizer: Any = None
    dtype: str = "auto"
    device: str = "auto"
    max_num_seqs: int = 32
    max_num_batched_tokens: int = 8192
    max_model_len: int | None = None
    kv_cache_tokens: int | None = None
    seed: int | None = 0
    speculative_config: SpeculativeConfig | dict[str, Any] | None = None
    enforce_eager: bool = False
    fused_ops: bool = True
    attention_backend: str = "auto"
    gpu_memory_utilization: float = 0.9
    logprobs_mode: str = "raw_logprobs"
    trust_remote_code: bool = False
    tensor_parallel_size: int = 1
    max_memory: dict[Any, Any] | None = None
    num_threads: int | None = None
    structured_forced_tokens: int = 8
    enable_prefix_caching: bool = False
    deterministic: bool = False
    async_scheduling: bool | None = None

    def __post_init__(self) -> None:
        name = "EngineConfig"
        if self.model is None or (isinstance(self.model, str) and not self.model):
            _fail(name, "model", self.model, "a hub id, a path, 'smollm2-135m' or a loaded model")
        if self.dtype not in DTYPES:
            _fail(name, "dtype", self.dtype, " | ".join(DTYPES))
        if not isinstance(self.device, str) or not self.device:
            _fail(name, "device", self.device, "'auto', 'cpu', 'cuda', 'cuda:N'")
        if not _is_int(self.max_num_seqs) or self.max_num_seqs < 1:
            _fail(name, "max_num_seqs", self.max_num_seqs, "an integer >= 1")
        if not _is_int(self.max_num_batched_tokens) or self.max_num_batched_tokens < 1:
            _fail(name, "max_num_batched_tokens", self.max_num_batched_tokens, "an integer >= 1")
        for field in ("max_model_len", "kv_cache_tokens"):
            value = getattr(self, field)
            if value is not None and (not _is_int(value) or value < 2):
                _fail(name, field, value, "None or an integer >= 2")
        if self.seed is not None and (not _is_int(self.seed) or self.seed < 0):
            _fail(name, "seed", self.seed, "None or an integer >= 0")
        for field in ("enforce_eager", "fused_ops", "trust_remote_code", "enable_prefix_caching",
                      "deterministic"):
            if not isinstance(getattr(self, field), bool):
                _fail(name, field, getattr(self, field), "true or false")
        if self.async_scheduling is not None and not isinstance(self.async_scheduling, bool):
            _fail(name, "async_scheduling", self.async_scheduling, "None, true or false")
        if self.attention_backend not in ATTENTION_BACKENDS:
            _fail(name, "attention_backend", self.attention_backend, " | ".join(ATTENTION_BACKENDS))
        u = self.gpu_memory_utilization
        if not _is_number(u) or not 0 < u <= 1:
            _fail(name, "gpu_memory_utilization", u, "a number in (0, 1]")
        if self.logprobs_mode not in LOGPROBS_MODES:
            _fail(name, "logprobs_mode", self.logprobs_mode, " | ".join(LOGPROBS_MODES))
        if not _is_int(self.tensor_parallel_size) or self.tensor_parallel_size < 1:
            _fail(name, "tensor_parallel_size", self.tensor_parallel_size, "an integer >= 1")
        if self.tensor_parallel_size > 1 and not isinstance(self.model, str):
            _fail(name, "model", type(self.model).__name__, "a name or path with "
                  "tensor_parallel_size > 1 (every rank loads its own share)")
        if self.tensor_parallel_size > 1 and self.attention_backend == "paged":
            # (each rank would read its own heads' pool, but no test has run it yet)
            _fail(name, "attention_backend", self.attention_backend,
                  "'gather' with tensor_parallel_size > 1 (paged attention is not yet tested "
                  "under tensor parallelism)")
        if self.deterministic:  # (the batch-invariant parts: see the docstring)
            if self.attention_backend == "gather":
                _fail(name, "attention_backend", self.attention_backend,
                      "'auto' or 'paged' with deterministic=True")
            if not self.fused_ops:
                _fail(name, "fused_ops", self.fused_ops, "true with deterministic=True")
            if self.tensor_parallel_size != 1:
                _fail(name, "tensor_parallel_size", self.tensor_parallel_size,
                      "1 with deterministic=True")
        self.max_memory = _max_memory(self.max_memory, self.device)
        if self.num_threads is not None and (not _is_int(self.num_threads)
                                             or self.num_threads < 1):
            _fail(name, "num_threads", self.num_threads, "None (the default) or an integer >= 1")
        if (not _is_int(self.structured_forced_tokens)
                or not 0 <= self.structured_forced_tokens <= MAX_SPEC_LEN):
            _fail(name, "structured_forced_tokens", self.structured_forced_tokens,
                  f"an integer in [0, {MAX_SPEC_LEN}]")
        if isinstance(self.speculative_config, dict):
            self.speculative_config = SpeculativeConfig.from_dict(self.speculative_config)
        spec = self.speculative_config
        if self.tensor_parallel_size > 1 and spec is not None and spec.method in TP_REFUSED:
            # (early_exit runs the target's split layers, whose collectives the other ranks
            # would never join; a draft head gets whole copies of the embedding and output head)
            _fail(name, "speculative_config.method", spec.method, "a proposer that does not run "
                  "the target's own layers with tensor_parallel_size > 1 (they are split across "
                  "the ranks): ngram, draft_model, eagle, ngram_eagle or eagle3")
        elif not isinstance(self.speculative_config, (SpeculativeConfig, type(None))):
            _fail(name, "speculative_config", self.speculative_config,
                  "None, a dict or a SpeculativeConfig")
        if self.async_scheduling and self.tensor_parallel_size > 1:
            _fail(name, "async_scheduling", self.async_scheduling,
                  "None or false with tensor_parallel_size > 1 (the other ranks replay steps "
                  "sent as host lists)")
