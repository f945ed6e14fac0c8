"""Per-request sampling parameters as tensors, for one batch of requests."""

from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from samplers.keyed_random import seed_key
from samplers.metadata import aligned, host_to_device
from samplers.sampling_params import SamplingParams


@dataclass
class SamplingTensors:
    """Sampling parameters of a batch, one entry per request.

    Greedy requests (temperature 0) have ``inv_temperature`` 1 and their filters switched off, so
    that kernels can scale every row by ``inv_temperature`` and still see the raw argmax.
    """

    temperature: torch.Tensor  # [batch_size] float32, 0 = greedy
    inv_temperature: torch.Tensor  # [batch_size] float32, 1 / temperature (1 for greedy)
    top_k: torch.Tensor  # [batch_size] int32, 0 = off
    top_p: torch.Tensor  # [batch_size] float32, 1 = off
    min_p: torch.Tensor  # [batch_size] float32, 0 = off
    is_greedy: torch.Tensor  # [batch_size] int32, 1 where temperature is 0
    # One generator per request; None draws from ``default_generator``.
    generators: list[torch.Generator | None]
    # Host copies (no device reads during a step).
    greedy: list[bool]  # [batch_size]
    max_top_k: int  # largest top-k in the batch, 0 when none
    any_top_p: bool
    any_min_p: bool
    # What requests without a generator of their own draw from (the engine's RNG); None: torch's
    # global RNG.
    default_generator: torch.Generator | None = None
    # Keyed requests (``samplers.keyed_random``): [batch_size, 4] int64 rows (keyed 0/1, seed's
    # low word, seed's high word, output position of the request's first row); None when no
    # request of the batch is keyed. A keyed request's tokens are the keyed Gumbel-max samples
    # and its drafts are verified by matching them.
    keys: torch.Tensor | None = None
    keyed: list[bool] | None = None  # [batch_size] host copy of keys[:, 0]
    # ([batch_size, 4] temperature, inv_temperature, top_p, min_p; [batch_size, 2] top_k,
    # is_greedy: views of the copies ``from_params`` made, or None: :meth:`packed` stacks them)
    _packed: tuple[torch.Tensor, torch.Tensor] | None = field(default=None, repr=False)

    @property
    def any_keyed(self) -> bool:
        return self.keyed is not None and any(self.keyed)

    @property
    def batch_size(self) -> int:
        return len(self.greedy)

    @property
    def all_greedy(self) -> bool:
        return all(self.greedy)

    def packed(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The parameters in two tensors, ``[batch_size, 4]`` float32 (temperature,
        inv_temperature, top_p, min_p) and ``[batch_size, 2]`` int32 (top_k, is_greedy): what a
        CUDA graph copies in two launches (:mod:`samplers.sampled_chains`). Views of
        :meth:`from_params`' own copies where it made them (no launch)."""
        if self._packed is None:
            self._packed = (
                torch.stack([self.temperature, self.inv_temperature, self.top_p, self.min_p], 1),
                torch.stack([self.top_k, self.is_greedy], 1))
        return self._packed

    def advanced(self, tokens: torch.Tensor) -> SamplingTensors:
        """The same requests' tensors for their next step, each having made ``tokens [batch]``
        (on the device) more output tokens: keyed rows' output positions move on, on the
        device (an overlapped step's verification is not read yet)."""
        if self.keys is None:
            return self
        keys = self.keys.clone()
        keys[:, 3] = (keys[:, 3] + tokens) & 0xFFFFFFFF
        return replace(self, keys=keys)

    def select(self, rows: list[int], index: torch.Tensor) -> SamplingTensors:
        """The requests at ``rows`` (and ``index``, the same rows on the device), in that
        order (the batch-wide maxima and flags stay the whole batch's: filters that are off for
        a row do nothing to it)."""
        keyed = None if self.keyed is None else [self.keyed[i] for i in rows]
        if keyed is not None and not any(keyed):
            keyed = None
        return replace(
            self, temperature=self.temperature[index], inv_temperature=self.inv_temperature[index],
            top_k=self.top_k[index], top_p=self.top_p[index], min_p=self.min_p[index],
            is_greedy=self.is_greedy[index], generators=[self.generators[i] for i in rows],
            greedy=[self.greedy[i] for i in rows],
            keys=None if keyed is None else self.keys[index], keyed=keyed, _packed=None)

    @property
    def needs_filters(self) -> bool:
        return self.max_top_k > 0 or self.any_top_p or self.any_min_p

    @classmethod
    def from_params(cls, params: list[SamplingParams],
                    generators: list[torch.Generator | None] | None = None,
                    device: torch.device | str = "cpu",
                    default_generator: torch.Generator | None = None,
                    seeds: list[int | None] | None = None,
                    positions: list[int] | None = None) -> SamplingTensors:
        """Gather ``params`` (one per request) into tensors on ``device``.

        ``generators[i]`` is request ``i``'s own ``torch.Generator`` (on ``device``) or None (it
        then draws from ``default_generator``, or from torch's global RNG when that is None).
        ``seeds[i]`` (not None) keys request ``i``'s random numbers by that seed and its output
        positions, ``positions[i]`` being the output position of its first row this step
        (:mod:`samplers.keyed_random`); greedy requests are never keyed.
        """
        if generators is None:
            generators = [None] * len(params)
        if len(generators) != len(params):
            raise ValueError(f"generators has {len(generators)} entries, expected one per "
                             f"request ({len(params)})")
        greedy = [p.temperature == 0.0 for p in params]
        temperature = [p.temperature for p in params]
        inv_temperature = [1.0 if g else 1.0 / t for g, t in zip(greedy, temperature, strict=True)]
        top_k = [0 if g or p.top_k < 0 else p.top_k for g, p in zip(greedy, params, strict=True)]
        top_p = [1.0 if g else p.top_p for g, p in zip(greedy, params, strict=True)]
        min_p = [0.0 if g else p.min_p for g, p in zip(greedy, params, strict=True)]
        # Two host-to-device copies per batch: one float32, one int32, each row padded to
        # start on 16 bytes (:func:`~samplers.metadata.aligned`).
        size = len(params)
        pad = [0] * (aligned(size) - size)
        floats = host_to_device([temperature + pad, inv_temperature + pad, top_p + pad,
                                 min_p + pad], torch.float32, device)  # [4, padded batch]
        ints = host_to_device([top_k + pad, [int(g) for g in greedy] + pad], torch.int32,
                              device)  # [2, padded batch]
        keys = keyed = None
        if seeds is not None:
            if positions is None or len(seeds) != size or len(positions) != size:
                raise ValueError(f"seeds and positions need one entry per request ({size}), got "
                                 f"{None if seeds is None else len(seeds)} and "
                                 f"{None if positions is None else len(positions)}")
            keyed = [s is not None and not g for s, g in zip(seeds, greedy, strict=True)]
            if any(keyed):
                rows = [[int(k), *seed_key(s if k else 0), int(p) & 0xFFFFFFFF]
                        for k, s, p in zip(keyed, seeds, positions, strict=True)]
                keys = host_to_device(rows, torch.int64, device)  # [batch_size, 4]
            else:
                keyed = None
        return cls(
            temperature=floats[0, :size],
            inv_temperature=floats[1, :size],
            top_k=ints[0, :size],
            top_p=floats[2, :size],
            min_p=floats[3, :size],
            is_greedy=ints[1, :size],
            generators=list(generators),
            greedy=greedy,
            max_top_k=max(top_k, default=0),
            any_top_p=any(p < 1.0 for p in top_p),
            any_min_p=any(p > 0.0 for p in min_p),
            default_generator=default_generator,
            keys=keys,
            keyed=keyed,
            _packed=(floats[:, :size].t(), ints[:, :size].t()),
        )
