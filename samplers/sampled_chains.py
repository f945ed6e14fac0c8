"""Sampling of uniform chains (every request ``k`` drafts, ``k = 0`` a plain step's one token)
where requests sample, replayed from a CUDA graph per layout.

Why: a sampled step's sampling is the filters (top-k: ``topk`` and a threshold; top-p: a
softmax, a sort, a cumulative sum and a scatter; min-p), the random draws and the three
verification kernels: 6 launches at temperature alone, about 40 with top-p or top-k, each
launched from Python after the forward. At a small batch those launches, not the GPU, set a
sampled step's time (docs/performance.md, "Sampling in a CUDA graph"). Replayed,
they are one launch, the copies of its inputs (logits, drafts, two of parameters, the keys of
seeded requests) and one of its output.

A layout is ``(padded batch, k, top-k size, top-p on, min-p on, keyed)``: the batch padded
to the next power of two (:func:`~samplers.greedy.chain_batch`), the top-k size to one too (the
k-th largest value of each row is read from a longer sorted list: the same threshold). The
graph runs ``sampler.verify`` on static tensors, so its tokens are the sampler's; its padding
rows (greedy rows at first, then what a larger batch left there) give answers that are
dropped. The
random draws come from the engine's generator, registered with each graph (each replay moves
its offset on, as an eager draw does). Seeded requests' samples are keyed by seed and position
(:mod:`samplers.keyed_random`): the same tokens graphed or eager, in any batch.

Not graphed (the sampler's own call, the same distribution): a batch mixing seeded and
unseeded sampled requests (its keyed rows are a host list the layout would have to key),
requests with generators of their own, a sampler that verifies by argmax alone, a batch of
greedy requests alone (it draws no random numbers eagerly; replayed, it would). The engine keeps
one where a flight's forward replays CUDA graphs (CUDA, graphs on); ``KeyedGraphs(capture=False)``
runs the padded layout eagerly, which the tests check on CPU.
"""

from __future__ import annotations

import torch

from samplers.base import VerificationSampler
from samplers.greedy import chain_batch
from samplers.keyed_graphs import KeyedGraphs
from samplers.metadata import SpecDecodeMetadata
from samplers.sampling_tensors import SamplingTensors

KEYED_NONE, KEYED_ALL = 0, 1


def _layout_top_k(max_top_k: int, vocab_size: int) -> int:
    """The top-k size of a layout: ``max_top_k`` rounded up to a power of two, at most the
    vocabulary (0: no top-k)."""
    return 0 if max_top_k <= 0 else min(1 << (max_top_k - 1).bit_length(), vocab_size)


class SampledChains:
    """``sampler.verify`` of uniform chains through :class:`KeyedGraphs`; see the module
    docstring. ``generator``: the engine's (None: torch's default CUDA generator, which a
    capture registers itself)."""

    def __init__(self, sampler: VerificationSampler, graphs: KeyedGraphs,
                 generator: torch.Generator | None) -> None:
        self.sampler, self.graphs, self.generator = sampler, graphs, generator

    def graphed(self, sampling: SamplingTensors) -> bool:
        """Whether ``sampling``'s requests sample through a graph (else :meth:`verify` calls
        the sampler)."""
        keyed = sampling.keyed
        return (not self.sampler.all_greedy and not sampling.all_greedy
                and (keyed is None or all(k or g for k, g in zip(keyed, sampling.greedy,
                                                                  strict=True)))
                and all(g is None for g in sampling.generators))

    def verify(self, logits: torch.Tensor, drafts: torch.Tensor,
               sampling: SamplingTensors) -> tuple[torch.Tensor, bool]:
        """int64 ``[batch, k + 1]`` (a fresh tensor): ``sampler.verify`` of ``logits [batch *
        (k + 1), vocab_size]`` (float32) and ``drafts [batch, k]`` (one-hot drafts: no draft
        probabilities), ``sampling`` the requests' tensors; and whether the call was steady
        (False: a layout ran its first time, or was captured: a step not to price)."""
        batch, k = drafts.shape
        if sampling.batch_size != batch or logits.shape[0] != batch * (k + 1):
            raise ValueError(f"{sampling.batch_size} requests' sampling tensors and logits of "
                             f"{logits.shape[0]} rows for {batch} chains of {k} drafts")
        if not self.graphed(sampling):
            return self.sampler.verify(logits, SpecDecodeMetadata.uniform(drafts), sampling,
                                       None), True
        padded, vocab_size = chain_batch(batch), logits.shape[1]
        top_k = _layout_top_k(sampling.max_top_k, vocab_size)
        keyed = KEYED_ALL if sampling.any_keyed else KEYED_NONE  # (every sampled row keyed)
        key = (padded, k, top_k, sampling.any_top_p, sampling.any_min_p, keyed)
        floats, ints = sampling.packed()
        inputs = [logits, drafts, floats, ints]
        if keyed == KEYED_ALL:
            inputs.append(sampling.keys)

        def body(lg: torch.Tensor, dr: torch.Tensor, fl: torch.Tensor, it: torch.Tensor,
                 keys: torch.Tensor | None = None) -> torch.Tensor:
            fl, it = fl.t(), it.t()  # [4, padded], [2, padded]: rows of stride 1 (_greedy_padded)
            static = SamplingTensors(
                temperature=fl[0], inv_temperature=fl[1], top_p=fl[2], min_p=fl[3],
                top_k=it[0], is_greedy=it[1], generators=[None] * padded,
                # (every row drawn for: greedy rows are told apart by is_greedy on the device)
                greedy=[False] * padded, max_top_k=top_k, any_top_p=key[3], any_min_p=key[4],
                default_generator=self.generator, keys=keys,
                keyed=None if keys is None else [True] * padded)
            return self.sampler.verify(lg, SpecDecodeMetadata.uniform(dr), static, None)

        rows = [padded * (k + 1), padded, padded, padded, padded][:len(inputs)]
        if key not in self.graphs:  # (the layout's static buffers are copies of these)
            inputs = _greedy_padded(inputs, rows)
        tokens = self.graphs.run(key, body, inputs, rows=rows)[:batch].clone()
        return tokens, self.graphs.last_steady


def _greedy_padded(inputs: list[torch.Tensor], rows: list[int]) -> list[torch.Tensor]:
    """A layout's inputs ``[logits, drafts, floats, ints(, keys)]`` padded to ``rows`` with
    greedy rows: zero logits, drafts and keys, every filter off (temperature 1, top-p 1, min-p
    0, top-k 0). (A row of zeros throughout would have a top-p of 0, which drops every token:
    a row of NaN probabilities.) The parameters ``[rows, 4]`` and ``[rows, 2]`` are laid out
    column by column, so that the body reads each parameter as a row of stride 1, as the
    kernels want, without a copy (a buffer cloned from them keeps their strides)."""
    logits, drafts, floats, ints, *keys = inputs
    pad = rows[2] - floats.shape[0]
    out = [torch.cat([x, x.new_zeros((n - x.shape[0], *x.shape[1:]))])
           for x, n in zip([logits, drafts, *keys], [rows[0], *rows[1:2], *rows[4:]],
                           strict=True)]
    params = [torch.cat([x.t(), x.new_tensor(neutral)[:, None].expand(-1, pad)], dim=1).t()
              for x, neutral in ((floats, [1.0, 1.0, 1.0, 0.0]), (ints, [0, 1]))]
    return [out[0], out[1], *params, *out[2:]]
