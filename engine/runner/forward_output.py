"""What one runner forward returns: the logits asked for, and the facts about the step that its
caller needs afterwards (hidden states for a draft head, layout facts for the speculation
controller's step costs), so that nobody reads the runner's attributes after the call."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class ForwardOutput:
    """``logits``: float32 ``[num_logits, vocab_size]``, the rows asked for (all new tokens by
    default, slot order then token order). ``hidden``: ``[total_new_tokens, hidden_size]``, the
    final hidden states of every new token in the same order; None unless the forward was asked
    for them (``keep_hidden=True``). ``steady``: the step timed like the steps after it (not a
    graph bucket's eager first step or capture: :attr:`CudaGraphs.steady
    <engine.runner.cuda_graphs.CudaGraphs.steady>`). ``packed_rows``: the step's rows when it was
    packed, one new token a row (:mod:`engine.runner.step_layout`), else None. ``kv_len``: the
    step's context, its longest sequence's tokens (new ones included). ``aux_hidden``:
    ``[total_new_tokens, len(aux_layers) * hidden_size]``, the inputs of the decoder layers
    the runner keeps (``ModelRunner.keep_aux_layers``: an EAGLE-3 head's low, middle and high
    layers), concatenated in their order, with ``hidden``; None otherwise. ``argmax``: int64
    ``[num_logits]``, each logits row's greedy token as :func:`samplers.greedy.argmax_tokens`
    gives it, where the step's CUDA graph computed it with the logits (decode buckets, and
    verification buckets of a few rows; else None); it may be a view of the graph's static
    output: read it before the runner's next forward."""

    logits: torch.Tensor
    hidden: torch.Tensor | None
    steady: bool
    packed_rows: int | None
    kv_len: int
    aux_hidden: torch.Tensor | None = None
    argmax: torch.Tensor | None = None


@dataclass(frozen=True)
class FedTokens:
    """New tokens that are still on the device when a forward is launched (overlapped steps: the
    tokens the step before sampled): slot ``b``'s first new token is ``values[sources[b]]``
    instead of the stand-in its ``token_ids`` hold; ``sources[b] < 0``: none (its ids as given).
    ``values``: int64 ``[n]`` on the runner's device; a negative one (a row the sampling kernels
    marked invalid) is fed as id 0."""

    values: torch.Tensor
    sources: list[int]


@dataclass(frozen=True)
class FedChains:
    """A forward whose every slot's new tokens and positions are still on the device
    (overlapped drafting steps: the step before verified on the device how far each sequence
    got, and its draft head drafted from there): slot ``b`` appends ``tokens[b]`` at positions
    ``base[b], base[b] + 1, ...``. ``tokens``: int64 ``[batch, width]``, ``base``: int64
    ``[batch]``, both on the runner's device; ``base_hi [batch]``: on the host, the most each
    ``base[b]`` can be, for which the runner reserves KV rows (positions up to ``base_hi[b] +
    width - 1``)."""

    tokens: torch.Tensor
    base: torch.Tensor
    base_hi: list[int]

    @property
    def width(self) -> int:
        return int(self.tokens.shape[1])
