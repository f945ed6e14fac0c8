"""The random numbers of one step, drawn by torch outside the kernels.

Per sampled (non-greedy) request, in this order from its own generator:

1. ``q ~ Exp(1)`` over the vocabulary, for the exponential race ``argmax(w / q)``, which picks
   index ``i`` with probability ``w_i / sum(w)`` (Gumbel-max in another guise). One race is run per
   request per step, on the distribution where it stops: the recovered distribution of its first
   rejected draft, or the bonus distribution when every draft is accepted. Only one of them is
   ever emitted, and which one depends only on the acceptance uniforms, so one ``q`` serves both.
2. ``u ~ U[0, 1)`` for each of its drafts (only for samplers that accept at random).

A request without drafts draws exactly what plain sampling draws (``q`` only); greedy requests
and keyed ones (``SamplingTensors.keys``, whose numbers are keyed by seed and position,
:mod:`samplers.keyed_random`) draw nothing here.
"""

from __future__ import annotations

import torch

from samplers.sampling_tensors import SamplingTensors


def draw_randoms(sampling: SamplingTensors, num_draft_tokens: list[int], vocab_size: int,
                 device: torch.device, need_uniform: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Return ``q [batch_size, vocab_size]`` and ``u [batch_size, max(max_spec_len, 1)]``.

    Rows of greedy and keyed requests are left unset (never read).
    """
    batch_size = len(num_draft_tokens)
    max_spec_len = max(num_draft_tokens, default=0)
    q = torch.empty(batch_size, vocab_size, dtype=torch.float32, device=device)
    u = torch.empty(batch_size, max(max_spec_len, 1), dtype=torch.float32, device=device)
    need_uniform = need_uniform and max_spec_len > 0
    keyed = sampling.keyed or [False] * batch_size
    sampled = [not g and not k for g, k in zip(sampling.greedy, keyed, strict=True)]
    if any(s and g is None for s, g in zip(sampled, sampling.generators, strict=True)):
        # one launch for every request without a generator of its own
        q.exponential_(generator=sampling.default_generator)
        if need_uniform:
            u.uniform_(generator=sampling.default_generator)
    for i, generator in enumerate(sampling.generators):
        if generator is None or not sampled[i]:
            continue
        if generator.device.type != device.type:
            raise ValueError(f"request {i}: its generator is on {generator.device}, the logits "
                             f"on {device}; allowed: a generator on the logits' device")
        q[i].exponential_(generator=generator)
        if need_uniform and num_draft_tokens[i] > 0:
            u[i, : num_draft_tokens[i]].uniform_(generator=generator)
    return q, u
