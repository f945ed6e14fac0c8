"""Logits adjustments from per-slot state on the device, for steps sampled ahead of the host.

An overlapped plain step is launched, and sampled, before the host has committed the step
before it (``engine.overlap``). The adjustments of :class:`~samplers.logits_adjust.LogitsAdjuster`
that need no token history, only a request's parameters and how often each token was output
(``allowed_token_ids``, one-token ``bad_words``, ``min_tokens``, ``logit_bias``, repetition /
frequency / presence penalties), are applied there from rows kept a slot (a cache slot: one
running sequence), each ``[capacity, vocab_size]``:

- ``banned`` bool: never sampled; ``min_tokens`` bool: masked while the output is short;
- ``bias`` float32; ``in_prompt`` bool: the prompt's tokens (repetition penalty);
- ``counts`` float32: each token's count in the output, raised on the device by the tokens
  each adjusted step samples (:meth:`Adjusted.count`), so the next step's penalties need
  nothing from the host;
- ``scales [capacity, 3]`` float32: repetition, frequency, presence.

A drafting step's chains (:meth:`SlotAdjustments.apply_chains`) read the same rows, row ``j``
of a chain its slot's counts plus the chain's first ``j`` drafts, and the tokens its
verification keeps (every chain's accepted drafts and recovered or bonus token: a count the
host does not know yet) raise the counts there (:meth:`AdjustedChains.count`); the slot then
holds the chain's *mark*, which the next chain fed from it asks for.

A slot's rows are written when a sequence first uses it (from the adjuster's
:meth:`~samplers.logits_adjust.LogitsAdjuster.dense_rows`, device to device), and its counts
made again from the host's output tokens when they are not the sequence's output so far: a
synchronous step came between (one with drafts, adjusted on the host), or a step counted its
tokens and raised, to be sampled again. Slots are handed out lowest first, so the capacity
(doubled as needed) follows the number of sequences adjusted at once. Values equal the
per-sample adjuster's bit for bit (tests/samplers/test_slot_adjustments.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from samplers.logits_adjust import LogitsAdjuster, penalized

# the per-slot rows, their dtypes and their value where a sequence has none (scales aside):
# a bias of -0.0 changes no bit of any logit, a negative zero's included
_ROWS = {"banned": (torch.bool, False), "min_tokens": (torch.bool, False),
         "bias": (torch.float32, -0.0), "in_prompt": (torch.bool, False)}


@dataclass
class AdjustedRow:
    """One row of a step to adjust: its index in the step's logits, its sequence's slot, the
    sequence (identity: whose state the slot holds), its adjuster and output tokens on the host
    (committed), and ``fed``: the index of its token still in flight in the ``fed`` tensor
    :meth:`SlotAdjustments.apply` is given (None: every output token is on the host)."""

    row: int
    slot: int
    owner: object
    adjuster: LogitsAdjuster
    output: Sequence[int]
    fed: int | None = None
    holds: object = None  # (a chain's: the mark its slot's counts must hold; None: the output)
    first_output: int = 0  # the position of its first output token (its prompt's length)


class Adjusted:
    """A step's penalized rows (``rows``: their indices in the step's logits, ``slots``: their
    slots, both on the device), whose counts its sampled tokens raise (:meth:`count`), and
    what each slot's count then holds (``counted``: slot -> output tokens)."""

    def __init__(self, state: SlotAdjustments, rows: torch.Tensor, slots: torch.Tensor,
                 counted: dict[int, int]) -> None:
        self._state, self._rows, self._slots, self._counted = state, rows, slots, counted

    def count(self, tokens: torch.Tensor) -> None:
        """Add the step's sampled ``tokens [num_rows]`` (on the device; a negative one, a row
        the kernels marked invalid, fails its sequence at the commit) to its rows' counts."""
        state = self._state
        if self._rows.numel():
            ids = tokens.index_select(0, self._rows).clamp_(0, state.vocab_size - 1)
            state.add(self._slots, ids)
        state.counted.update(self._counted)

    def forget(self) -> None:
        """The step was dropped after :meth:`count`: its slots' counts are made again when
        next used."""
        for slot in self._counted:
            self._state.counted.pop(slot, None)


class AdjustedChains:
    """A drafting step's penalized chains (``chains``: their indices among the step's chains,
    ``slots``: their slots, on the device), whose kept tokens raise their counts
    (:meth:`count`), after which each slot holds ``mark``."""

    def __init__(self, state: SlotAdjustments, chains: torch.Tensor, slots: torch.Tensor,
                 slot_list: list[int], mark: object) -> None:
        self._state, self._chains, self._slots = state, chains, slots
        self._slot_list, self.mark = slot_list, mark

    def count(self, tokens: torch.Tensor, accepted: torch.Tensor) -> None:
        """Add each chain's kept tokens, ``tokens [num_chains, width]`` up to column
        ``accepted [num_chains]`` (the accepted drafts, then the recovered or bonus token; on
        the device), to its slot's counts: one atomic add a token, those past a chain's end
        adding 0."""
        state = self._state
        if self._chains.numel():
            ids = tokens.index_select(0, self._chains).clamp(0, state.vocab_size - 1)
            width = ids.shape[1]
            kept = (torch.arange(width, device=ids.device)[None, :]
                    <= accepted.index_select(0, self._chains)[:, None])  # [m, width]
            state.add(self._slots[:, None].expand(-1, width).reshape(-1), ids.view(-1),
                      kept.view(-1).to(torch.float32))
        for slot in self._slot_list:
            state.counted[slot] = self.mark

    def forget(self) -> None:
        """The step was dropped (before or after :meth:`count`): its slots' counts are made
        again when next used (from the host's output: no step fed from its chains launches)."""
        for slot in self._slot_list:
            self._state.counted.pop(slot, None)


class SlotAdjustments:
    """The per-slot rows (see the module docstring) for logits ``vocab_size`` wide on
    ``device``; ``to_device``: how an int64 array gets there without waiting for the queued
    work (the runner's pinned staging)."""

    def __init__(self, vocab_size: int, device: torch.device,
                 to_device: Callable[[np.ndarray], torch.Tensor]) -> None:
        self.vocab_size, self.device, self._to_device = vocab_size, torch.device(device), to_device
        self.capacity = 0
        self.rows: dict[str, torch.Tensor] = {}  # name -> [capacity, vocab_size], made on use
        self.counts = torch.zeros(0, vocab_size, dtype=torch.float32, device=self.device)
        self.scales = torch.zeros(0, 3, dtype=torch.float32, device=self.device)
        self.ones = torch.ones(0, dtype=torch.float32, device=self.device)
        self._width = torch.tensor(vocab_size, dtype=torch.long, device=self.device)
        self.owner: dict[int, object] = {}  # slot -> the sequence its rows are
        self.has: dict[int, frozenset[str]] = {}  # slot -> the rows its sequence uses
        # slot -> output tokens its counts hold (-1: none), or the mark of the drafting step
        # that counted its kept tokens (AdjustedChains)
        self.counted: dict[int, object] = {}
        # the last step's index layout (host list) and its copy on the device
        self._layout: tuple[list[int] | None, torch.Tensor | None] = (None, None)
        self._chain_layout: tuple[list[int] | None, torch.Tensor | None] = (None, None)

    def apply(self, logits: torch.Tensor, rows: list[AdjustedRow],
              fed: torch.Tensor | None = None, base: torch.Tensor | None = None) -> Adjusted:
        """Adjust ``rows`` of ``logits [num_rows, vocab_size]`` (float32) in place from their
        slots' state; ``fed [m]``: tokens in flight on the device (each row's ``fed`` indexes
        it: its output's next token, sampled but not on the host). A row with ``holds`` (a
        step fed from a drafting flight's chains) needs its slot to hold that mark
        (ValueError otherwise), and its slot holds a new mark once the step counts its token.
        ``base [num_rows]`` (on the device; a step fed from chains, whose kept tokens the host
        has not read): each row's fed token's position, so a row whose committed output is
        short of its ``min_tokens`` is masked by where it sits (it samples output token
        ``base + 1 - first_output``), as :meth:`apply_chains` masks a chain's first row;
        without it, by the host's count. Returns what the step's sampled tokens must add
        (:meth:`Adjusted.count`)."""
        self._reserve(max(r.slot for r in rows) + 1, len(rows))
        used: set[str] = set()
        active, rebuild, counted = [], [], {}
        short = []  # (with base: the first fed position no longer masked; -1: none masked)
        for i, r in enumerate(rows):
            used |= self._owned(r)
            done = len(r.output) + (r.fed is not None)  # (the output before this position)
            p = r.adjuster.params
            ahead = bool(r.adjuster.min_tokens_ids) and done < p.min_tokens
            if base is not None:  # (the host's count may lack kept tokens: the device tells)
                short.append(r.first_output + p.min_tokens - 1 if ahead else -1)
                ahead = False
            active.append(int(ahead))
            if p.needs_penalties:
                if not self._counts_hold(r):
                    rebuild.append(i)
                counted[r.slot] = done + 1 if r.holds is None else object()
        n = len(rows)
        masks = any(t >= 0 for t in short)
        layout = ([r.row for r in rows] + [r.slot for r in rows] + active
                  + [r.row for r in rows if r.slot in counted]
                  + [r.slot for r in rows if r.slot in counted] + (short if masks else []))
        if layout != self._layout[0]:  # (a step like the one before reuses its indices)
            self._layout = layout, self._to_device(np.array(layout, dtype=np.int64))
        rows_t, slots_t, active_t, pen_rows_t, pen_slots_t, short_t = self._layout[1].split(
            [n, n, n, len(counted), len(counted), n if masks else 0])
        if rebuild:
            self._rebuild([rows[i] for i in rebuild], fed)
        # [n, vocab_size]: the rows to adjust (all of them, in order: the logits themselves)
        whole = n == logits.shape[0] and all(r.row == i for i, r in enumerate(rows))
        x = logits if whole else logits.index_select(0, rows_t)
        neg_inf = float("-inf")
        if "banned" in used:
            x.masked_fill_(self.rows["banned"].index_select(0, slots_t), neg_inf)
        if "min_tokens" in used and any(active):
            x.masked_fill_(self.rows["min_tokens"].index_select(0, slots_t)
                           & active_t[:, None].bool(), neg_inf)
        if masks:  # [n]: the rows whose fed position is before their min_tokens' last mask
            x.masked_fill_(self.rows["min_tokens"].index_select(0, slots_t)
                           & (base.index_select(0, rows_t) < short_t)[:, None], neg_inf)
        if "bias" in used:
            x += self.rows["bias"].index_select(0, slots_t)  # (-0.0 elsewhere: no bit changes)
        if counted:
            in_prompt = (self.rows["in_prompt"].index_select(0, slots_t)
                         if "in_prompt" in used else None)
            x = penalized(x, self.counts.index_select(0, slots_t), in_prompt,
                          self.scales.index_select(0, slots_t))
        if not whole:
            logits.index_copy_(0, rows_t, x)
        elif x is not logits:  # (a repetition penalty's result is a new tensor)
            logits.copy_(x)
        return Adjusted(self, pen_rows_t, pen_slots_t, counted)

    def apply_chains(self, logits: torch.Tensor, rows: list[AdjustedRow], drafts: torch.Tensor,
                     fed: torch.Tensor | None = None, base: torch.Tensor | None = None
                     ) -> AdjustedChains:
        """Adjust in place the chains ``rows`` (each one's ``row``: its chain's index) of
        ``logits [num_chains * width, vocab_size]`` (float32, a chain's rows consecutive) from
        their slots' state: row ``j`` of a chain as its sequence's output followed by its first
        ``j`` drafts (``drafts [num_chains, width - 1]`` on the device), as
        :meth:`LogitsAdjuster.apply` adjusts it. A penalized row's slot must hold what
        ``holds`` names (a chain's mark: the chain it is fed from counted its kept tokens),
        else ValueError; one without ``holds`` has its counts made again from its output (and
        its ``fed`` token) where they are not that. A sequence whose ``min_tokens`` may still
        be ahead (its committed output is shorter) is masked by where its chain sits, ``base
        [num_chains]`` on the device (each chain's fed token's position: row ``j`` samples
        output token ``base + j + 1 - first_output``, so the chain before it need not be read
        on the host); without ``base``: ValueError. Returns what the step's kept tokens must
        add (:meth:`AdjustedChains.count`)."""
        num_chains, width = drafts.shape[0], drafts.shape[1] + 1
        vocab_size = self.vocab_size
        if logits.shape != (num_chains * width, vocab_size):
            raise ValueError(f"logits {tuple(logits.shape)} for {num_chains} chains of "
                             f"{width} rows of {vocab_size}")
        self._reserve(max(r.slot for r in rows) + 1, num_chains * width)
        used: set[str] = set()
        rebuild, penalized_rows, mark = [], [], object()
        # each row's masked positions: a chain row samples at base + j + 1, masked while that is
        # before first_output + min_tokens (-1: none can be: min_tokens behind its output)
        short = [-1] * len(rows)
        for i, r in enumerate(rows):
            p = r.adjuster.params
            if r.adjuster.min_tokens_ids and len(r.output) < p.min_tokens:
                if base is None:
                    raise ValueError(f"slot {r.slot}: min_tokens={p.min_tokens} with "
                                     f"{len(r.output)} output tokens needs the chains' "
                                     f"positions")
                short[i] = r.first_output + p.min_tokens - 1
            used |= self._owned(r)
            if p.needs_penalties:
                if not self._counts_hold(r):
                    rebuild.append(i)
                penalized_rows.append(i)
        n, m = len(rows), len(penalized_rows)
        masks = any(t >= 0 for t in short)
        layout = ([r.row for r in rows] + [r.slot for r in rows]
                  + [rows[i].row for i in penalized_rows] + [rows[i].slot for i in penalized_rows]
                  + (short if masks else []))
        if layout != self._chain_layout[0]:  # (chains like the flight before reuse its indices)
            self._chain_layout = layout, self._to_device(np.array(layout, dtype=np.int64))
        chains_t, slots_t, pen_chains_t, pen_slots_t, short_t = self._chain_layout[1].split(
            [n, n, m, m, n if masks else 0])
        if rebuild:
            self._rebuild([rows[i] for i in rebuild], fed)
        # [n, width, vocab_size]: the chains to adjust (all of them, in order: the logits)
        whole = n == num_chains and all(r.row == i for i, r in enumerate(rows))
        chains = logits.view(num_chains, width, vocab_size)
        x = chains if whole else chains.index_select(0, chains_t)
        if "banned" in used:
            x.masked_fill_(self.rows["banned"].index_select(0, slots_t)[:, None], float("-inf"))
        if masks:  # [n, width]: the rows sampling before their sequence's min_tokens
            at = (base if whole else base.index_select(0, chains_t))[:, None] + torch.arange(
                width, device=x.device)
            x.masked_fill_(self.rows["min_tokens"].index_select(0, slots_t)[:, None]
                           & (at < short_t[:, None])[:, :, None], float("-inf"))
        if "bias" in used:  # (-0.0 elsewhere: no bit changes)
            x += self.rows["bias"].index_select(0, slots_t)[:, None]
        if m:
            counts = self.counts.index_select(0, slots_t)[:, None].repeat(1, width, 1)
            d = drafts if whole else drafts.index_select(0, chains_t)  # [n, width - 1]
            valid = ((d >= 0) & (d < vocab_size)).to(torch.float32)
            d = d.clamp(0, vocab_size - 1)
            for j in range(1, width):  # (rows j on count draft j: rows j.. of each chain)
                counts[:, j:].scatter_add_(2, d[:, j - 1, None, None].expand(n, width - j, 1),
                                           valid[:, j - 1, None, None].expand(n, width - j, 1))
            in_prompt = (self.rows["in_prompt"].index_select(0, slots_t)[:, None]
                         .expand(n, width, vocab_size).reshape(n * width, vocab_size)
                         if "in_prompt" in used else None)
            flat = x.view(n * width, vocab_size)
            out = penalized(flat, counts.view(n * width, vocab_size), in_prompt,
                            self.scales.index_select(0, slots_t).repeat_interleave(width, 0))
            if out is not flat:  # (a repetition penalty's result is a new tensor)
                flat.copy_(out)
        if not whole:
            chains.index_copy_(0, chains_t, x)
        return AdjustedChains(self, pen_chains_t, pen_slots_t,
                              [rows[i].slot for i in penalized_rows], mark)

    def _owned(self, r: AdjustedRow) -> frozenset[str]:
        """The rows ``r``'s slot uses, written first where it held another sequence."""
        if self.owner.get(r.slot) is not r.owner:
            self._take(r.slot, r.owner, r.adjuster)
        return self.has[r.slot]

    def _counts_hold(self, r: AdjustedRow) -> bool:
        """Whether ``r``'s slot's counts hold what its row needs: its output and its token in
        flight, or the mark ``r.holds`` (else ValueError: the host cannot count them again)."""
        holds = len(r.output) + (r.fed is not None) if r.holds is None else r.holds
        if self.counted.get(r.slot) == holds:  # (a mark: equal only to itself)
            return True
        if r.holds is not None:
            raise ValueError(f"slot {r.slot}'s counts are not those of the chain it is fed from")
        return False

    def release(self, slot: int) -> None:
        """``slot``'s sequence left it: its rows are written again by the next to use it (and
        the sequence is not kept alive here)."""
        self.owner.pop(slot, None)
        self.has.pop(slot, None)
        self.counted.pop(slot, None)

    def add(self, slots: torch.Tensor, ids: torch.Tensor,
            weights: torch.Tensor | None = None) -> None:
        """Count token ``ids[i]`` ``weights[i]`` times more (None: once) in slot ``slots[i]``
        (each ``[n]`` on the device): one atomic add each, exact in any order (whole numbers
        below 2**24), where an accumulating ``index_put_`` sorts its indices first (several
        launches)."""
        flat = torch.addcmul(ids, slots, self._width)  # slot * vocab_size + id
        self.counts.view(-1).index_add_(0, flat, self.ones[:ids.numel()] if weights is None
                                        else weights)

    def _reserve(self, num_slots: int, num_rows: int) -> None:
        """Room for slots ``0 .. num_slots - 1`` (doubling) and ``num_rows`` count updates."""
        if self.ones.numel() < num_rows:
            self.ones = torch.ones(num_rows, dtype=torch.float32, device=self.device)
        if num_slots <= self.capacity:
            return
        capacity = max(8, self.capacity)
        while capacity < num_slots:
            capacity *= 2
        self.rows = {name: _grown(t, capacity, _ROWS[name][1]) for name, t in self.rows.items()}
        self.counts = _grown(self.counts, capacity, 0.0)
        self.scales = _grown(self.scales, capacity, 0.0)
        self.capacity = capacity

    def _take(self, slot: int, owner: object, adjuster: LogitsAdjuster) -> None:
        """Write ``slot``'s rows for ``owner``'s ``adjuster`` (device to device); the rows it
        does not use get their value for none (``_ROWS``)."""
        dense = adjuster.dense_rows(self.vocab_size, self.device)
        for name, (dtype, none) in _ROWS.items():
            if name in dense and name not in self.rows:
                self.rows[name] = torch.full((self.capacity, self.vocab_size), none,
                                             dtype=dtype, device=self.device)
            if name in self.rows:
                if name in dense:
                    self.rows[name][slot].copy_(dense[name])
                else:
                    self.rows[name][slot].fill_(none)
        self.scales[slot].copy_(dense["scales"])
        self.owner[slot] = owner
        self.has[slot] = frozenset(name for name in _ROWS if name in dense)
        self.counted[slot] = -1

    def _rebuild(self, rows: list[AdjustedRow], fed: torch.Tensor | None) -> None:
        """Count again, from the host's output tokens (and a token in flight), the rows of
        ``rows``' slots."""
        vocab_size = self.vocab_size
        outputs = [np.asarray(r.output, dtype=np.int64) for r in rows]
        outputs = [o[o < vocab_size] for o in outputs]
        slots = np.array([r.slot for r in rows], dtype=np.int64)
        owner = np.repeat(slots, [len(o) for o in outputs])
        with_fed = [(r.slot, r.fed) for r in rows if r.fed is not None]
        index = self._to_device(np.concatenate(
            [slots, owner, np.concatenate(outputs) if outputs else owner,
             np.array([s for s, _ in with_fed] + [f for _, f in with_fed], dtype=np.int64)]))
        slots_t, owner_t, tokens_t, fed_slots, fed_at = index.split(
            [len(slots), len(owner), len(owner), len(with_fed), len(with_fed)])
        self.counts.index_fill_(0, slots_t, 0.0)
        self._reserve(0, len(owner))
        self.add(owner_t, tokens_t)
        if with_fed:
            if fed is None:
                raise ValueError("rows with a token in flight need the fed tensor")
            self.add(fed_slots, fed.index_select(0, fed_at).clamp_(0, vocab_size - 1))


def _grown(t: torch.Tensor, capacity: int, fill: float | bool) -> torch.Tensor:
    """``t [rows, ...]`` in a tensor of ``capacity`` rows, the new ones ``fill``."""
    grown = torch.full((capacity, *t.shape[1:]), fill, dtype=t.dtype, device=t.device)
    grown[:t.shape[0]].copy_(t)
    return grown
