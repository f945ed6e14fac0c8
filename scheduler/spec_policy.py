"""How many drafts each sequence of an engine step gets.

One k for the step (:meth:`AdaptiveK.choose_batch`, rule in :mod:`scheduler.adaptive_k`),
because the target pads every sequence to the step's longest; seeded sampling sequences keep the
configured k (their output must not depend on timings); nobody drafts past ``max_tokens`` or the
context. With n-gram drafts, which cost next to nothing, every decoding sequence also gets drafts
up to the step's padded length (:meth:`DraftPolicy.fill_padding`). The verify cost comes from the
measured step times (:class:`~scheduler.adaptive_k.StepCostModel`) unless the config fixes it;
while that fit has too few steps without drafts, every ``PLAIN_STEP_EVERY``-th step drafts nothing
so that it can compare.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from samplers.sampling_params import SamplingParams
from scheduler.adaptive_k import DEFAULT_VERIFY_COST, AcceptanceTracker, AdaptiveK, StepCostModel
from scheduler.scheduler import ScheduledSequence


class SpeculationOptions(Protocol):
    """The knobs of ``engine.config.SpeculativeConfig`` that the policy reads."""

    adaptive_k: bool
    verify_cost_per_token: float | None
    draft_cost_ratio: float | None
    adaptive_probe_interval: int


class SpeculatingSequence(Protocol):
    """What the policy reads of a sequence (``engine.sequence.Sequence``)."""

    params: SamplingParams
    acceptance: AcceptanceTracker
    num_tokens: int
    num_output_tokens: int
    max_spec_tokens: int | None  # the request's own cap on its drafts per step (None: none)


# While the cost fit lacks steps without drafts, every this many steps drafts nothing.
PLAIN_STEP_EVERY = 2


class SpeculationPolicy:
    """The engine's choice of k, step by step (see the module docstring). ``max_k`` is 0 when
    nothing proposes; ``drafts_are_free``: the proposer's drafts cost next to nothing (n-gram);
    ``measured_draft_cost()`` gives the measured draft/target step-cost ratio."""

    def __init__(self, spec: SpeculationOptions | None, max_k: int, max_model_len: int,
                 drafts_are_free: bool, measured_draft_cost: Callable[[], float]) -> None:
        self.max_k = max_k
        self.max_model_len = max_model_len
        self.measured_draft_cost = measured_draft_cost
        self.free_drafts = bool(max_k and drafts_are_free and spec.adaptive_k)
        self.fixed_draft_cost = spec.draft_cost_ratio if spec is not None else None
        fixed_v = spec.verify_cost_per_token if spec is not None else None
        self.adaptive = AdaptiveK(max_k, DEFAULT_VERIFY_COST if fixed_v is None else fixed_v,
                                  spec.adaptive_probe_interval if spec else 1,
                                  enabled=bool(spec and spec.adaptive_k),
                                  probe_k=max_k if drafts_are_free else 1)
        self.step_costs = StepCostModel(DEFAULT_VERIFY_COST) if fixed_v is None else None
        self._verify_cost: float | None = None  # this step's measured v (None: fixed)
        self._fixed_cost = 0.0  # this step's measured once-per-step cost of drafting
        self._step_k = 0  # this step's k for the sequences without a fixed k

    def new_tracker(self) -> AcceptanceTracker:
        return self.adaptive.new_tracker()

    @staticmethod
    def fixed_k(seq: SpeculatingSequence) -> bool:
        """A seeded sample must not depend on timings: the measured costs steer adaptive k, and
        a different k draws different (equally distributed) tokens. It keeps the configured k."""
        return seq.params.seed is not None and not seq.params.greedy

    def begin_step(self, running: list[SpeculatingSequence]) -> None:
        """Fix this step's k from the running sequences' acceptance and the measured costs."""
        self.adaptive.tick()
        if self.max_k == 0:
            return
        if not running:  # (only admissions: their prefills draft nothing, and a choice made
            self._step_k = 0  # for no one must not reset the batch's probing backoff)
            return
        if self.step_costs is not None:
            self._verify_cost, self._fixed_cost = self.step_costs.costs(len(running))
        cost = (self.fixed_draft_cost if self.fixed_draft_cost is not None
                else self.measured_draft_cost())
        if (self.step_costs is not None and self.adaptive.enabled
                and self.adaptive.clock % PLAIN_STEP_EVERY == 0
                and self.step_costs.wants_plain_step()):
            self._step_k = 0  # a step without drafts, for the cost fit
            return
        trackers = [seq.acceptance for seq in running if not self.fixed_k(seq)]
        self._step_k = self.adaptive.choose_batch(trackers, cost, self._verify_cost,
                                                  self._fixed_cost)

    def num_spec_tokens(self, seq: SpeculatingSequence) -> int:
        """The drafts ``seq`` asks for this step."""
        k = self.max_k if self.fixed_k(seq) else self._step_k
        if k == 0:  # (the usual answer when drafting does not pay: keep it cheap)
            return 0
        return max(0, min(k, self.draft_room(seq)))

    def draft_room(self, seq: SpeculatingSequence) -> int:
        """Drafts that can still become output (context length and max_tokens), at most the
        request's own cap."""
        room = self.max_model_len - seq.num_tokens - 1
        if seq.max_spec_tokens is not None:
            room = min(room, seq.max_spec_tokens)
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        return room

    def fill_padding(self, items: list[ScheduledSequence], free_kv_tokens: int | None) -> None:
        """The target pads every sequence to the step's longest: up to that length, drafts cost
        the target forward nothing, and n-gram drafts next to nothing. Give them to every
        decoding sequence (seeded sampling keeps its k), as far as the KV cache holds them."""
        if not self.free_drafts or not items:
            return
        longest = min(max(item.num_tokens for item in items), 1 + self.max_k)
        if longest == 1:
            return
        spare = 0
        if free_kv_tokens is not None:
            spare = free_kv_tokens - sum(item.num_tokens for item in items)
        for item in items:
            seq = item.seq
            gap = longest - item.num_tokens
            if gap <= 0 or item.num_context_tokens != 1 or self.fixed_k(seq):
                continue
            extra = min(gap, self.draft_room(seq) - item.num_spec_tokens, spare)
            if extra > 0:
                item.num_spec_tokens += extra
                spare -= extra

    def kept_drafts(self, items: list[ScheduledSequence], draft_token_ids: list[list[int]],
                    num_backed: list[int] | None) -> list[int]:
        """How many of each item's drafts to verify: its scheduled k, and with adaptive k no
        more than the step's longest *backed* run (``num_backed``, see
        :attr:`proposers.Proposal.num_backed`). Past that the
        drafts would lengthen the padded forward for guesses the proposer does not stand by;
        up to it they ride in the padding for free. Seeded sampling keeps its k."""
        keep = [item.num_spec_tokens for item in items]
        backed = num_backed
        if backed is None or not self.adaptive.enabled:
            return keep
        fixed = [self.fixed_k(item.seq) for item in items]
        width = max((min(k, len(d)) if f else min(k, b) for k, d, b, f in zip(
            keep, draft_token_ids, backed, fixed, strict=True)), default=0)
        return [k if f else min(k, width) for k, f in zip(keep, fixed, strict=True)]

    def record_step(self, items: list[ScheduledSequence], drafts: list[list[int]],
                    seconds: float) -> None:
        """A verified step's forward + verify time, for the cost fit (decode steps only)."""
        if self.step_costs is None or not all(item.num_context_tokens == 1 for item in items):
            return
        # the forward pads every sequence to the longest: that is what the step paid for
        self.step_costs.record(len(items), len(items) * max(map(len, drafts)), seconds)

    def update(self, seq: SpeculatingSequence, num_drafted: int, num_accepted: int) -> None:
        """A sequence's verified step: its acceptance and the engine's recent one."""
        self.adaptive.update(seq.acceptance, num_drafted, num_accepted)
