"""The proposer interface: what the engine hands a proposer each step and what it gets back.

The engine calls :meth:`Proposer.propose` once per step for the whole batch. Each request brings
its full context (prompt + output so far) and how many tokens to guess (``num_spec_tokens``, 0
turns speculation off for it). The proposer answers with 0..k draft tokens per request and, when
the drafts were *sampled*, the processed probabilities they were drawn from (one row per draft
token, flattened in request order), which lossless rejection sampling needs. One-hot proposers
(n-gram lookup, greedy drafting) return ``draft_probs=None``.

After verification the engine calls :meth:`Proposer.on_accepted` with the length of the context
that stays, and :meth:`Proposer.remove` when a request finishes or is preempted.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch
from torch import nn

from samplers.sampling_params import SamplingParams

# adjust_logits(prefix_token_ids, logits [vocab_size]) -> logits [vocab_size]
AdjustLogits = Callable[[Sequence[int], torch.Tensor], torch.Tensor]
# A verification still to run on the device (Proposer.verify_and_draft): its inputs, each with
# the batch first, give (tokens [batch, width], accepted [batch], *more), each output with the
# batch first (samplers.chain_accept.accept_chains is one)
Verification = Callable[..., tuple[torch.Tensor, ...]]


@dataclass
class ProposeRequest:
    """One request's input to :meth:`Proposer.propose`.

    ``token_ids`` is the full context (prompt + output so far). ``adjust_logits`` is the engine's
    per-position hook (penalties, ``logit_bias``, ``allowed_token_ids``, ``bad_words``): called
    with the prefix a position would have and its raw logits, before ``process_logits``.
    ``seed``: the request's own seed (None: it draws from the proposer's generator); a proposer
    that samples its drafts draws a seeded request's draft at output position ``position + j``
    with the keyed noise the target's token there is drawn with (``samplers.keyed_random``), so
    that the draft is the target's token whenever both distributions pick it (coupled drafts).
    """

    req_id: str | int
    token_ids: Sequence[int]
    num_spec_tokens: int
    sampling_params: SamplingParams
    adjust_logits: AdjustLogits | None = None
    # the engine verifies a draft *tree* for this request (greedy, nothing that makes a
    # position's logits depend on the drafts before it): see ``Proposal.parents``
    tree: bool = False
    seed: int | None = None
    position: int = 0  # the output position of this request's first draft
    # every request of the step decodes one token and may verify ahead on the device (the
    # engine may launch a drafting flight from the step if all draft one width): a proposer
    # that drafts on the device gives each request its drafts, whatever it found
    uniform: bool = False

    def __post_init__(self) -> None:
        k = self.num_spec_tokens
        if isinstance(k, bool) or not isinstance(k, int) or k < 0:
            raise ValueError(f"ProposeRequest.num_spec_tokens={k!r} is invalid: "
                             "allowed an integer >= 0 (0 = no speculation)")
        if len(self.token_ids) == 0:
            raise ValueError(f"ProposeRequest.token_ids of request {self.req_id!r} is empty: "
                             "allowed a context of at least one token")


@dataclass
class Proposal:
    """Drafts for every request of the batch, in request order.

    ``draft_token_ids[i]`` holds 0..``num_spec_tokens`` tokens for request ``i``.
    ``draft_probs`` is None for one-hot drafts, else one float32 row per draft token in the order
    of the flattened drafts: the processed distribution each token was drawn from.
    ``num_backed[i]``, when given, is how many of request ``i``'s leading drafts the proposer's
    own evidence backs (an n-gram match of n tokens backs n); the rest are cheap guesses that an
    adaptive engine verifies only where the step pays for them anyway. None: all are backed.
    ``parents[i]``, when given and not None (only for a request asked with ``tree``): request
    ``i``'s drafts are the nodes of a tree, a parent before its children; ``parents[i][j]`` is
    the index of draft ``j``'s parent among them, -1 for a child of the context's last token.
    The nodes at depth ``d`` are candidates for the ``d``-th token: a tree of depth ``k`` counts
    as ``k`` drafts for ``num_spec_tokens``.
    """

    draft_token_ids: list[list[int]]
    # [num_tokens, vocab_size] float32, or None for one-hot drafts
    draft_probs: torch.Tensor | None = None
    num_backed: list[int] | None = None  # [batch_size], each <= len(draft_token_ids[i])
    parents: list[list[int] | None] | None = None  # [batch_size] (see above)

    @property
    def num_tokens(self) -> int:
        return sum(len(d) for d in self.draft_token_ids)


class Proposer(ABC):
    """Guesses the next tokens of many requests at once; never decides acceptance.

    ``drafts_are_free``: a draft costs next to nothing to make (a table lookup, no model), so the
    speculation policy may fill a step's padding with more of them.
    """

    drafts_are_free: bool = False
    # ``last_proposal_steady``: the last :meth:`propose` was timed like the ones after it (False
    # after one that captured a CUDA graph or ran a shape for the first time: the engine keeps
    # its time out of the speculation controller's costs)
    last_proposal_steady: bool = True
    # ``needs_features``: the proposer drafts from the target's final hidden states, which the
    # engine hands it after each forward (:meth:`on_features`)
    needs_features: bool = False
    # ``feature_layers``: with ``needs_features``, the target's decoder layers whose inputs are
    # the features instead (an EAGLE-3 head's low, middle and high layers): :meth:`on_features`
    # then gets them concatenated in this order, ``[rows, len(feature_layers) * hidden_size]``;
    # None: the final hidden states
    feature_layers: tuple[int, ...] | None = None
    # ``observes``: :meth:`observe` does work (n-gram's index of the text kept current, the
    # draft head's pending pairs written)
    observes: bool = False
    # ``observe_every``: the engine calls :meth:`observe` at every this-many-th step without a
    # proposal (n-gram: a proposal catches up on the tokens since, at the same cost per token;
    # the calls themselves are what a plain step pays)
    observe_every: int = 8
    # ``drafts_on_device``: :meth:`draft_after` drafts a step's next drafts on the device from
    # its verification there (overlapped drafting steps), :meth:`advance` tells it the outcome
    drafts_on_device: bool = False
    # ``adjusts_drafts``: :meth:`propose` drafts from logits the request's ``adjust_logits``
    # adjusted, which :meth:`draft_after` does not (its drafts would be rejected more often):
    # a request with adjustments then drafts from the host
    adjusts_drafts: bool = False
    # ``pairs_on_device``: :meth:`write_after` takes a plain step's features and sampled tokens
    # on the device (overlapped plain steps), :meth:`advance` tells it they were committed
    pairs_on_device: bool = False

    @abstractmethod
    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        """Draft up to ``num_spec_tokens`` tokens for each request."""

    def observe(self, requests: Sequence[ProposeRequest]) -> None:  # noqa: B027
        """The contexts of a step that asked for no drafts (each request's
        ``num_spec_tokens`` is 0), shown while the GPU runs the step's forward: a proposer that
        indexes the text (n-gram) brings its index up to date in the forward's shadow, instead
        of catching up on every token since its last proposal when it is next asked (the draft
        head writes its pending pairs there). Nothing here may wait for the GPU."""

    def on_accepted(self, req_id: str | int, num_tokens: int) -> None:  # noqa: B027
        """Verification kept the first ``num_tokens`` tokens of the request's context + drafts.

        Stateless proposers ignore it; stateful ones drop whatever they hold past that point.
        """

    def remove(self, req_id: str | int) -> None:  # noqa: B027
        """The request finished or was preempted: forget its state."""

    def on_features(self, updates: Sequence[FeatureUpdate],  # noqa: B027
                    features: torch.Tensor) -> None:
        """``features [rows, hidden_size]``: the target's final hidden states (with
        ``feature_layers``: its layers' inputs, ``[rows, len(feature_layers) * hidden_size]``);
        update ``u``'s positions are the ``u.count`` rows from ``u.row`` (called only when
        ``needs_features``)."""

    def draft_after(self, req_ids: Sequence[str | int], features: torch.Tensor,
                    tokens: torch.Tensor, accepted: torch.Tensor, base: torch.Tensor,
                    base_hi: Sequence[int], steps: int) -> torch.Tensor:
        """Only with ``drafts_on_device``: ``steps`` drafts ``[batch, steps]`` on the device for
        each request's next step, from a verification step still on the device: request
        ``b``'s ``width`` tokens sat at positions ``base[b] ...`` (``base_hi[b]``: the most
        ``base[b]`` can be), ``features [batch * width, hidden]`` their target features,
        ``tokens [batch, width]`` what verification gave at each position (the accepted drafts,
        then the recovered or bonus token, then negative placeholders), ``accepted [batch]``
        how many drafts it accepted. Nothing may wait for the device."""
        raise NotImplementedError(f"{type(self).__name__} drafts on the host only")

    def verify_and_draft(self, req_ids: Sequence[str | int], features: torch.Tensor,
                         verify: Verification, inputs: Sequence[torch.Tensor],
                         base: torch.Tensor, base_hi: Sequence[int], steps: int
                         ) -> tuple[tuple[torch.Tensor, ...], torch.Tensor]:
        """Only with ``drafts_on_device``: :meth:`draft_after` from the outputs of
        ``verify(*inputs)`` (``(tokens, accepted, *more)``, see :data:`Verification`); returns
        those outputs and the drafts. A proposer that drafts in a CUDA graph may run the
        verification inside it (one replay for both, the step's host time); here it runs
        first."""
        outs = tuple(verify(*inputs))
        return outs, self.draft_after(req_ids, features, outs[0], outs[1], base, base_hi, steps)

    def write_after(self, req_ids: Sequence[str | int], features: torch.Tensor,
                    tokens: torch.Tensor, positions: Sequence[int]) -> None:
        """Only with ``pairs_on_device``: a plain step still on the device fed request ``b``'s
        token at position ``positions[b]``; ``features [batch, hidden]`` are its target
        features there and ``tokens [batch]`` what it sampled after. Bring them in on the
        device (what is pending of the request on the host first), for requests that
        :meth:`ready_on_device` covers up to that position; :meth:`advance` follows when the
        step is committed. Nothing may wait for the device."""
        raise NotImplementedError(f"{type(self).__name__} takes features on the host only")

    def ready_on_device(self, req_id: str | int, num_tokens: int) -> bool:
        """Only with ``drafts_on_device``: whether the request's state covers its context of
        ``num_tokens`` tokens but the newest (the host's), so that :meth:`draft_after` may draft
        from a step that fed that token."""
        return False

    def flush(self, req_ids: Sequence[str | int], contexts: Sequence[Sequence[int]]) -> None:
        """Only with ``drafts_on_device``: before :meth:`draft_after` drafts from a step the
        requests were not proposed for, bring in what is pending of their ``contexts`` (each
        request's tokens on the host: all but the step's)."""
        raise NotImplementedError(f"{type(self).__name__} drafts on the host only")

    def advance(self, req_id: str | int, length: int, features: torch.Tensor, row: int,
                token: int) -> None:
        """Only with ``drafts_on_device``: a step drafted by :meth:`draft_after` (or one whose
        pairs :meth:`write_after` took) was committed; the request's context is now ``length +
        1`` tokens, the newest ``token``, and ``features[row]`` is the target's feature at
        position ``length - 1``."""
        raise NotImplementedError(f"{type(self).__name__} drafts on the host only")


@dataclass
class FeatureUpdate:
    """A request's verified target features of one step: the positions ``start .. start +
    count - 1`` (every position whose token the target computed on a context it keeps: a
    prefill chunk's, or a verification's fed token and its accepted drafts). ``token_ids`` is
    the request's context after the step, so ``token_ids[j + 1]`` is the token that position
    ``j``'s logits gave. ``row``: its first row in the features handed with it (None: right
    after the previous update's rows)."""

    req_id: str | int
    start: int
    count: int
    token_ids: Sequence[int]
    row: int | None = None


class DraftForward(Protocol):
    """What a draft runner's forward returns (``engine.runner.ForwardOutput`` is one): float32
    ``logits [len(logits_indices), vocab_size]`` of the new tokens asked for."""

    @property
    def logits(self) -> torch.Tensor: ...

    @property
    def argmax(self) -> torch.Tensor | None:
        """int64 ``[len(logits_indices)]``: each logits row's argmax where the forward's CUDA
        graph computed it (``INVALID_TOKEN_ID`` for a row with a NaN, +inf or only -inf),
        else None."""


class DraftRunner(Protocol):
    """What a model-based proposer needs of the runner of its draft model: a paged KV cache with
    slots and rollback (``engine.runner.model_runner.ModelRunner`` is one)."""

    device: torch.device
    vocab_size: int  # the width of the draft's logits
    num_free_tokens: int  # KV rows left: a forward of more new tokens would not fit
    max_model_len: int  # positions a slot may hold

    def allocate_slot(self) -> int: ...

    def free_slot(self, slot: int) -> None: ...

    def truncate(self, slot: int, length: int) -> None: ...

    def seq_len(self, slot: int) -> int:
        """The tokens the slot holds KV rows for (rows reserved past its newest included)."""

    def forward(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                logits_indices: Sequence[int] | None = None) -> DraftForward:
        """Append each slot's ``token_ids`` to its cache and score them: the output's
        ``logits`` are float32 ``[len(logits_indices), vocab_size]``, the new tokens' rows
        ``logits_indices`` (slot order then token order; None: all)."""

    def forward_fed(self, slots: Sequence[int], tokens: torch.Tensor, base: torch.Tensor,
                    base_hi: Sequence[int]) -> DraftForward:
        """Append ``tokens [batch, width]`` (int64, on the device) to slot ``b`` at positions
        ``base[b] ...`` (int64 ``[batch]`` on the device; ``base_hi[b]``: the most it can be,
        rows reserved up to ``base_hi[b] + width - 1`` and kept) and score every new token,
        without reading the device: logits ``[batch * width, vocab_size]``."""


@dataclass
class ProposerContext:
    """What the engine hands a proposer factory besides the speculation config: the target, the
    limits, and the engine's own ways to load a model and to run one over a KV cache of its own
    (so that ``proposers`` never imports the engine)."""

    target_model: nn.Module
    target_tokenizer: Any
    vocab_size: int  # the width of the target's logits, that of the draft probabilities
    device: torch.device
    dtype: str
    max_num_seqs: int
    max_model_len: int
    # load_model(name_or_path) -> (model, tokenizer), as the engine loads its target
    load_model: Callable[[str], tuple[nn.Module, Any]]
    # make_runner(model) -> a runner over ``model`` with its own KV cache for max_num_seqs slots
    make_runner: Callable[[nn.Module], DraftRunner]
    # what requests without a seed draw from (None: torch's global RNG)
    generator: torch.Generator | None = None
    # the engine replays CUDA graphs (on a CUDA device, not enforce_eager): a proposer may too
    cuda_graphs: bool = False
    # the target's input embedding and output head, whole: a proposer reads these, not the
    # target's own (None: the target's own; under tensor parallelism those are split across the
    # ranks and their forwards are collectives, so the engine hands rank 0 whole copies)
    input_embeddings: nn.Module | None = None
    output_embeddings: nn.Module | None = None
    # the engine launches steps before it reads the ones in flight (``async_scheduling``): a
    # proposer that can draft on the device (``drafts_on_device``) should
    overlapped: bool = False

    def embeddings(self) -> tuple[nn.Module, nn.Module]:
        """The target's input embedding and output head for a proposer's own use (see
        ``input_embeddings``)."""
        model = self.target_model
        return (self.input_embeddings or model.get_input_embeddings(),
                self.output_embeddings or model.get_output_embeddings())
