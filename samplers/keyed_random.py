"""Random numbers keyed by what they are for: the noise of a seeded request's tokens.

A seeded request's token at output position ``t`` is the Gumbel-max sample

    token_t = argmax_v (z_t[v] - log E(seed, t, v)),    E = -log U,  U ~ U(0, 1)

with ``z_t = logits_t * inv_temperature`` after every filter (``-inf`` where filtered), which
is an exact draw from ``softmax(z_t)`` (the exponential race ``argmax(p / E)`` in log space).
``U`` comes from a counter-based generator, Philox4x32-10 (Salmon et al., SC'11): the counter is
``(v, t, purpose, 0)`` and the key the 64-bit seed, so a number depends on nothing but what it is
for. No stream is consumed: the token at position ``t`` is the same whatever the batch, however
many drafts earlier steps verified, and after a preemption recomputes the sequence.

Verification uses this directly (``samplers.verify_reference``, ``samplers.verify_triton``): a
seeded request's draft at position ``t`` is accepted iff it equals ``token_t``, and the first
position that disagrees emits ``token_t``. Every emitted token is then ``token_t`` itself, so the
output is the plain seeded sample, identical for no drafts, any k and any proposer. For a one-hot
draft ``x`` the acceptance probability is ``p_t(x)``, rejection sampling's. A draft model that
draws its own drafts with the same noise (``keyed_sample`` on its logits, same seed, position and
purpose) is *coupled*: its draft equals the target's token whenever both races pick the same
token.

The Triton kernels compute the same uniforms bit for bit (:func:`philox_uniform_tl` mirrors
:func:`philox_uniform`); the logarithms may differ in the last place, so the two agree on
every token except at exact near-ties.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

# The purposes of keyed numbers: the counter's third word.
PURPOSE_TOKEN = 0  # the token sampled at an output position (the target's and coupled drafts')

_MASK32 = 0xFFFFFFFF
_ROUND_A, _ROUND_B = 0xD2511F53, 0xCD9E8D57  # Philox4x32 multipliers
_KEY_A, _KEY_B = 0x9E3779B9, 0xBB67AE85  # Philox4x32 key increments (Weyl sequence)
PHILOX_ROUNDS = 10
# (the same, as constants a Triton kernel may read)
PURPOSE_TOKEN_TL = tl.constexpr(PURPOSE_TOKEN)
PHILOX_ROUNDS_TL = tl.constexpr(PHILOX_ROUNDS)


def seed_key(seed: int) -> tuple[int, int]:
    """The Philox key ``(low, high)`` 32-bit words of ``seed`` taken modulo 2**64."""
    seed &= (1 << 64) - 1
    return seed & _MASK32, seed >> 32


def _mulhilo(a: torch.Tensor, b: int) -> tuple[torch.Tensor, torch.Tensor]:
    """High and low 32-bit words of ``a * b`` for ``a`` int64 in [0, 2**32) and a 32-bit
    constant ``b``, exactly in int64 (the 64-bit product is split so nothing overflows)."""
    a_lo, a_hi = a & 0xFFFF, a >> 16
    lo_part, hi_part = a_lo * b, a_hi * b  # each < 2**48
    hi = (hi_part + (lo_part >> 16)) >> 16
    lo = ((hi_part & 0xFFFF) << 16) + lo_part
    return hi, lo & _MASK32


def philox4x32(c0: torch.Tensor, c1: torch.Tensor, c2: torch.Tensor, c3: torch.Tensor,
               k0: torch.Tensor, k1: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Philox4x32-10 of counter ``(c0, c1, c2, c3)`` under key ``(k0, k1)``: four words.
    Every argument is an int64 tensor (broadcastable) of values in [0, 2**32)."""
    for _ in range(PHILOX_ROUNDS):
        hi_b, lo_b = _mulhilo(c2, _ROUND_B)
        hi_a, lo_a = _mulhilo(c0, _ROUND_A)
        c0, c1, c2, c3 = hi_b ^ c1 ^ k0, lo_b, hi_a ^ c3 ^ k1, lo_a
        k0 = (k0 + _KEY_A) & _MASK32
        k1 = (k1 + _KEY_B) & _MASK32
    return c0, c1, c2, c3


def philox_uniform(seed_lo: torch.Tensor, seed_hi: torch.Tensor, position: torch.Tensor,
                   vocab_size: int, purpose: int) -> torch.Tensor:
    """``U(0, 1)`` float32 ``[n, vocab_size]``: entry ``v`` is word ``v % 4`` of Philox4x32-10
    at counter ``(v // 4, position[i], purpose, 0)`` under key ``(seed_lo[i], seed_hi[i])``, its
    top 23 bits mapped to the centre of their interval (never 0 or 1, exact in float32).

    ``seed_lo``, ``seed_hi``, ``position``: int64 ``[n]``, each in [0, 2**32).
    """
    n = position.shape[0]
    groups = -(-vocab_size // 4)
    c0 = torch.arange(groups, dtype=torch.int64, device=position.device).expand(n, groups)
    c1 = position.to(torch.int64)[:, None].expand(n, groups)
    words = philox4x32(c0, c1, torch.full_like(c0, purpose & _MASK32), torch.zeros_like(c0),
                       seed_lo.to(torch.int64)[:, None], seed_hi.to(torch.int64)[:, None])
    words = torch.stack(words, dim=-1).reshape(n, 4 * groups)[:, :vocab_size]
    return ((words >> 9).to(torch.float32) + 0.5) * (1.0 / (1 << 23))


def keyed_scores(z: torch.Tensor, seed_lo: torch.Tensor, seed_hi: torch.Tensor,
                 position: torch.Tensor, purpose: int = PURPOSE_TOKEN) -> torch.Tensor:
    """Gumbel-perturbed scores ``z - log(-log U)`` float32 ``[n, vocab_size]`` (``-inf``
    where ``z`` is): their argmax is an exact draw from ``softmax(z)``.

    ``z``: ``[n, vocab_size]`` logits times the inverse temperature, filtered entries ``-inf``.
    """
    u = philox_uniform(seed_lo, seed_hi, position, z.shape[1], purpose)
    z = z.float()
    return torch.where(z > float("-inf"), z - torch.log(-torch.log(u)), z)


def keyed_sample(z: torch.Tensor, seed_lo: torch.Tensor, seed_hi: torch.Tensor,
                 position: torch.Tensor, purpose: int = PURPOSE_TOKEN) -> torch.Tensor:
    """int64 ``[n]``: the keyed Gumbel-max token of each row of ``z`` (see the module
    docstring); ties go to the lowest id."""
    return keyed_scores(z, seed_lo, seed_hi, position, purpose).argmax(dim=-1)


@triton.jit
def philox_uniform_tl(offs, position, purpose, seed_lo, seed_hi):
    """Triton twin of :func:`philox_uniform` for vocabulary ids ``offs`` (a block of int32) of
    one row: ``position``, ``purpose``, ``seed_lo``, ``seed_hi`` are scalars in [0, 2**32).
    Each lane runs the Philox block of its group of four and keeps its own word."""
    zero = (offs * 0).to(tl.uint32)
    c0 = (offs // 4).to(tl.uint32)
    c1 = zero + position.to(tl.uint32)
    c2 = zero + purpose
    k0 = seed_lo.to(tl.uint32)
    k1 = seed_hi.to(tl.uint32)
    w0, w1, w2, w3 = tl.philox_impl(c0, c1, c2, zero, k0, k1, PHILOX_ROUNDS_TL)
    lane = offs % 4
    word = tl.where(lane == 0, w0, tl.where(lane == 1, w1, tl.where(lane == 2, w2, w3)))
    return ((word >> 9).to(tl.float32) + 0.5) * (1.0 / 8388608.0)


@triton.jit
def keyed_scores_tl(z, offs, position, purpose, seed_lo, seed_hi):
    """Triton twin of :func:`keyed_scores` over one block ``z`` (float32) of a row."""
    u = philox_uniform_tl(offs, position, purpose, seed_lo, seed_hi)
    return tl.where(z > float("-inf"), z - tl.log(-tl.log(u)), z)
