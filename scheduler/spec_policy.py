"""The goodput controller's engine side: the drafts of each step, chosen for tokens per second.

Within each sequence's cap (``scheduler.speculation``) the goodput controller
(:mod:`scheduler.goodput`) picks the step's width from step costs measured per batch size and
width and each request's acceptance per draft position.

A batch whose caller waits for all of it (``LLM.generate``: the call returns when its last
request finishes) is *closed* once nothing waits to be admitted and each running request has a
``max_tokens``: a token then shortens the call only when it goes to a sequence with the most
tokens left (unless a stop, such as EOS, ends the others first). So in a closed batch the
controller weighs only the *critical* sequences, the decoding ones within ``max_k`` tokens of
the most left (a step can move any of them to the front; a sequence still in its prefill cannot
draft yet and is left out); the others still verify drafts in the steps it widens (without it
the controller drafted for sequences that finished early while the batch took as many steps:
docs/design.md, "Measured reasons behind the runner's choices"). A server's requests are not
closed: each one's own finish counts. The payoff guard judges a closed batch's drafting steps
the same way: by how far they bring the call's end nearer (the most tokens left among its
sequences), not by the tokens they make (:mod:`scheduler.payoff_guard`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol

from scheduler.acceptance import StepUpdate
from scheduler.goodput import GoodputController, PackedRows
from scheduler.payoff_guard import PayoffGuard
from scheduler.scheduler import ScheduledSequence
from scheduler.speculation import (
    DraftPlan,
    RequestSpeculation,
    SpeculatingSequence,
    StepOutcome,
    cap,
    request_bounds,
)
from scheduler.tree_gate import TreeGate

LEARN_EVERY = 4  # steps whose outcomes an overlapped engine's controller learns together ...
LEARN_EVERY_MOST = 16  # ... up to this many at larger batches (:func:`learn_every`)


def learn_every(batch_size: int) -> int:
    """How many steps' outcomes an overlapped engine's controller learns together at
    ``batch_size`` sequences: ``LEARN_EVERY``, up to ``LEARN_EVERY_MOST`` from 8 sequences
    (half the batch). An update's host time is mostly per call (a fixed number of array
    operations, :meth:`~scheduler.acceptance.AcceptanceModel.update_steps`), and a larger
    batch's step is the one bound by its host, where learning every four steps was a tenth to
    a fifth of a chained step. Each step of a larger batch also brings more of the samples a
    decision rests on, so fewer steps make as many (docs/design.md, "The speculation
    controller")."""
    return min(LEARN_EVERY_MOST, max(LEARN_EVERY, batch_size // 2))


class SpeculationOptions(Protocol):
    """The knobs of ``engine.config.SpeculativeConfig`` that the controller reads."""

    adaptive_k: bool
    adaptive_guard: bool
    verify_cost_per_token: float | None
    draft_cost_ratio: float | None
    adaptive_probe_interval: int
    draft_tree: list[int] | None


class GoodputPolicy:
    """Each step's drafts chosen by the goodput controller (see the module docstring).
    ``max_k``: the configured k; ``drafts_are_free``: the proposer's drafts cost next to nothing
    (n-gram); ``measured_draft_cost()``: the measured draft/target step-cost ratio, the prior of
    a costly proposer's cost until its proposals are timed; ``packed_rows``: the runner's rule
    for packing a step of unequal rows (``ModelRunner.packed_rows``; None: never)."""

    learns = True

    def __init__(self, spec: SpeculationOptions, max_k: int, max_model_len: int,
                 drafts_are_free: bool, measured_draft_cost: Callable[[], float],
                 batch_bucket: Callable[[int], int] = int,
                 packed_rows: PackedRows | None = None) -> None:
        self.max_k = max_k
        self.max_model_len = max_model_len
        self.measured_draft_cost = measured_draft_cost
        self.free = drafts_are_free
        self.controller = GoodputController(
            max_k, drafts_are_free, spec.adaptive_probe_interval, spec.verify_cost_per_token,
            spec.draft_cost_ratio, batch_bucket, packed_rows)
        # (the guard judges measured costs only: fixed ones asked for the model's answer)
        self.guard = (PayoffGuard(self.controller.costs)
                      if spec.adaptive_guard and spec.verify_cost_per_token is None else None)
        # (trees against chains, measured likewise: only where the configuration drafts trees)
        self.trees = (TreeGate() if self.guard is not None and spec.draft_tree is not None
                      else None)
        self._step = 0  # engine steps begun (a sequence's cap is fresh when its step is this)
        self._batch_size = 0  # the running sequences at this step's plan (its cost's)
        self._idle: tuple[list[SpeculatingSequence], bool, int] | None = None  # the last
        # step's running sequences, waiting flag and acceptance version, when it drafted none
        # step -> (its steered sequences, the drafts the proposer backed for each): recorded
        # with that step's update (a GPU engine learns a step after the next one's proposal)
        self._proposals: dict[int, tuple[list[RequestSpeculation], list[int]]] = {}
        self._gated_steps: set[int] = set()  # steps whose proposal asked the tree gate
        # step -> the most tokens left (less one) of a sequence of that step's closed batch at
        # its plan, and the batch's sequences: the payoff guard's measure of the call's progress
        # (drafting steps only)
        self._fronts: dict[int, tuple[int, list[SpeculatingSequence]]] = {}
        self._pending: list[StepOutcome] = []  # outcomes deferred to be learnt together
        self._steady: tuple | None = None  # the last full decision's running sequences,
        # waiting flag, acceptance and cost versions and width, when it drafted (and every
        # sequence decoded, none left out of a closed batch's count)

    def new_tracker(self, seq: SpeculatingSequence, together: bool = False) -> RequestSpeculation:
        limit, end = request_bounds(seq, self.max_k, self.max_model_len)
        if self.guard is not None:
            self.guard.admit()
        return RequestSpeculation(self.controller.acceptance.new_row(), limit, end,
                                  together and seq.params.max_tokens is not None)

    def release(self, seq: SpeculatingSequence) -> None:
        """A sequence left the engine: its acceptance row is free."""
        self.controller.acceptance.release(seq.speculation)

    def plan(self, running: list[SpeculatingSequence], waiting: bool = False) -> DraftPlan:
        """Decide this step's drafts for the running sequences (newcomers' prefills draft
        nothing that the decision would change); ``waiting``: requests wait to be admitted
        (then the batch is not closed: see the module docstring)."""
        self._step += 1
        width = self._width(running, waiting)
        if width and self.guard is not None and not waiting and len(running) > 1:
            front = closed_front(running)
            if front is not None:
                self._fronts[self._step] = (front, list(running))
        return DraftPlan(width, self._step)

    def refresh(self, plan: DraftPlan, running: list[SpeculatingSequence]) -> None:
        """A plan made while the step before it was in flight (an overlapped engine: each
        sequence one token short), taken now: its caps cut to the sequences' tokens, and a
        closed batch's front measured again (else the guard credits the step one plain step
        too many)."""
        plan.refresh(running)
        if plan.step in self._fronts:
            front = closed_front(running)
            if front is None:
                del self._fronts[plan.step]
            else:
                self._fronts[plan.step] = (front, list(running))

    def _width(self, running: list[SpeculatingSequence], waiting: bool) -> int:
        if not running or not self.max_k:
            return 0
        if self.guard is not None and not self.guard.allows(len(running)):
            # (backed off: drafting at this batch size lost to plain decoding, measured)
            self._batch_size, self._idle = len(running), None
            return 0
        if (self._idle is not None and running == self._idle[0]
                and (waiting, self.controller.acceptance.version) == self._idle[1:]):
            # The same sequences as the last step, all decoding then, which drafted nothing,
            # and nothing learnt since: each one's tokens left went down by one (unless the
            # token budget skipped one), so the answer is still none (a cap only shrinks, and
            # who has the most tokens left is who had them), save a probe; at worst a change is
            # seen at the next probe, within ``adaptive_probe_interval`` steps.
            width = self.controller.plan_idle()
            if width:
                self._idle = None
            return width
        steady = self._steady
        if (steady is not None and self.controller.drafting and running == steady[0]
                and (waiting, self.controller.acceptance.version,
                     self.controller.costs.version) == steady[1:4]):
            # The same sequences as the last full decision, which drafted, and nothing learnt
            # since (an overlapped engine learns every learn_every() steps): the same width
            # (each cap is taken fresh by ``DraftPlan.drafts_for``).
            return self.controller.plan_again(len(running), steady[4])
        steered: list[RequestSpeculation] = []
        caps: list[int] = []
        step, closed = self._step, not waiting
        self._batch_size = len(running)
        for seq in running:
            spec = seq.speculation
            spec.cap = spec_cap = cap(seq)
            spec.step, spec.critical = step, True
            closed = closed and spec.closes
            steered.append(spec)
            caps.append(spec_cap)
        critical = self._critical(running) if closed and len(running) > 1 else None
        # (the step less the drafts: every sequence decodes; a prompt chunk's step is not
        # packed, and is not priced as one)
        n = len(running)
        longest = max(seq.num_uncached_tokens for seq in running)
        layout = (n, longest, n) if longest == 1 else None
        width = self.controller.plan(steered, caps, 0, self.measured_draft_cost(), critical, n,
                                     layout)
        self._idle = self._steady = None
        if (width and self.controller.drafting and critical is None
                and all(seq.num_uncached_tokens == 1 for seq in running)):
            self._steady = (list(running), waiting, self.controller.acceptance.version,
                            self.controller.costs.version, width)
        if (self.controller.settled
                and all(seq.num_uncached_tokens == 1 for seq in running)):
            self._idle = (list(running), waiting, self.controller.acceptance.version)
        return width

    def _critical(self, running: list[SpeculatingSequence]) -> list[bool] | None:
        """In a closed batch: which steered sequences decode and are within ``max_k`` tokens of
        the most tokens left among the decoding ones (marked on their state), or None when all
        are (or none decodes)."""
        # [n] tokens left - 1, for the sequences that decode this step (None: in a prefill)
        left = [seq.speculation.end - seq.num_tokens if seq.num_uncached_tokens == 1 else None
                for seq in running]
        most = max((n for n in left if n is not None), default=None)
        if most is None:
            return None
        least = most - self.max_k
        critical = [n is not None and n >= least for n in left]
        if all(critical):
            return None
        for seq, c in zip(running, critical, strict=True):
            seq.speculation.critical = c
        return critical

    def trim(self, items: list[ScheduledSequence], drafted: list[int],
             num_backed: list[int] | None, others: tuple[int, int, int] = (0, 0, 0)
             ) -> list[int]:
        """How many of each item's drafts to verify. A free proposer was asked for each cap:
        the controller now picks the step's width with the proposer's evidence (``num_backed``,
        see :attr:`proposers.Proposal.num_backed`), and every sequence verifies its drafts up
        to it. ``others``: the step's sequences that asked for no drafts, as (how many, the
        most new tokens of one, their new tokens): with ``items`` they lay out the step, which
        the controller prices."""
        got = [min(item.num_spec_tokens, d) for item, d in zip(items, drafted, strict=True)]
        if self.free:
            # (one pass over the step: this runs between the proposal and the forward)
            steered: list[RequestSpeculation] = []
            avail: list[int] = []
            backed: list[int] | None = None if num_backed is None else []
            critical = True
            # the step's new tokens, less the steered drafts
            num_others, longest, total = others
            for item, g, b in zip(items, got, num_backed or [None] * len(items), strict=True):
                spec = item.seq.speculation
                total += item.num_context_tokens
                longest = max(longest, item.num_context_tokens)
                steered.append(spec)
                avail.append(g)
                critical = critical and spec.critical
                if backed is not None:
                    backed.append(min(b, g))
            width = self.controller.choose_width(
                steered, avail, backed, 0,
                None if critical else [s.critical for s in steered],
                max(self._batch_size, len(items) + num_others),
                (len(items) + num_others, longest, total), record=False)
            self._proposals[self._step] = (steered, avail if backed is None else backed)
            got = [min(g, width) for g in got]
        return got

    def device_width(self, seqs: list[SpeculatingSequence], plan: DraftPlan,
                     ahead: int = 0) -> int:
        """:meth:`FixedK.device_width`'s answer, the controller's: a free proposer's plan asks
        for every sequence's cap, and where its drafts are made on the device there is no
        proposal for :meth:`trim` to choose the width after; so it is chosen here, before
        the launch, as :meth:`trim` would with every draft backed (the draft head drafts every
        sequence's cap). Without this a drafting flight verified the configured k at every
        batch size (docs/performance.md, "A drafting step's host work")."""
        avail = [plan.drafts_ahead(seq, ahead) for seq in seqs]
        most = max(avail, default=0)
        if not self.free or not most:
            return most
        steered = [seq.speculation for seq in seqs]
        critical = [spec.critical for spec in steered]
        n = len(seqs)
        width = min(most, self.controller.choose_width(
            steered, avail, None, 0, None if all(critical) else critical,
            max(self._batch_size, n), (n, 1, n), record=False))
        if not width:  # (a plain step: not the payoff guard's evidence of drafting)
            self._fronts.pop(plan.step, None)
        return width

    def allows_tree(self, batch_size: int) -> bool:
        """Whether a step of ``batch_size`` sequences that may draft trees does: where trees
        measured faster than chains (:mod:`scheduler.tree_gate`), always without the gate."""
        if self.trees is None:
            return True
        self._gated_steps.add(self._step)  # (only such steps are the gate's evidence)
        return self.trees.allows(batch_size)

    def learn(self, outcome: StepOutcome, defer: bool = False) -> None:
        """The step's acceptance (all verified sequences at once; a tree's step counts for its
        own sequence only: ``AcceptanceModel.update_steps``), a steady decode step's cost, the
        rows of the sequences that left in the step freed, and the next decision prepared
        (``GoodputController.prepare``). A GPU engine calls it while the next step's forward
        runs: a sequence aborted since is skipped. ``defer``: the engine overlaps its steps, so
        the host time here is on the critical path; while drafting, the outcome is kept and
        learnt with the others every :func:`learn_every` steps (or when a sequence left), and the
        decisions in between repeat the last one (``_width``): a decision then lags a few
        steps, which costs less than the planning it saves (docs/design.md, "The speculation
        controller"). While drafting stopped, plain steps' outcomes wait too (their costs),
        but a probe's is learnt at once, with them (a drift back to text that pays is seen as
        soon as without deferring)."""
        self._pending.append((outcome, self.controller.acceptance.clock))
        probe = not self.controller.drafting and any(outcome.drafted)
        if (defer and not probe and len(self._pending) < learn_every(len(outcome.seqs))
                and not outcome.finished):
            return
        pending, self._pending = self._pending, []
        # (the acceptance of every pending step in one update, then their costs; a sequence
        # leaves only at the last one: its row is still its own in the update)
        self.controller.acceptance.update_steps([self._acceptance_step(outcome, clock)
                                                 for outcome, clock in pending])
        for outcome, _ in pending:
            self._learn_costs(outcome)
        self.controller.prepare(self._batch_size)

    def _acceptance_step(self, outcome: StepOutcome, clock: int) -> StepUpdate:
        """What ``outcome`` teaches the acceptance model, learnt at engine step ``clock``: its
        live sequences' drafts and the proposal recorded for its step (an aborted sequence's
        row was released: it is skipped)."""
        proposals = self._proposals.pop(outcome.step, None)
        for step in [s for s in self._proposals if s < outcome.step]:  # (steps never learnt)
            del self._proposals[step]
        if proposals is not None:
            accs, found = proposals
            kept = [i for i, acc in enumerate(accs) if acc.row >= 0]
            proposals = ([accs[i] for i in kept], [found[i] for i in kept])
        live = [i for i, seq in enumerate(outcome.seqs) if seq.speculation.row >= 0]
        return StepUpdate([outcome.seqs[i].speculation for i in live],
                          [outcome.drafted[i] for i in live],
                          [outcome.accepted[i] for i in live], [outcome.backed[i] for i in live],
                          None if outcome.private is None else [outcome.private[i] for i in live],
                          proposals, clock)

    def _learn_costs(self, outcome: StepOutcome) -> None:
        """The rest of :meth:`learn` for one outcome: the payoff guard's, the tree gate's and the
        step costs' samples; the sequences that left in it are released."""
        timing = outcome.timing
        front = self._fronts.pop(outcome.step, None)
        for step in [s for s in self._fronts if s < outcome.step]:  # (steps never learnt)
            del self._fronts[step]
        if timing is not None and self.guard is not None and outcome.seqs:
            tokens = timing.batch_size + sum(outcome.accepted)
            if front is not None:
                # (a closed batch: worth as many plain steps as it brought the call's end nearer)
                tokens = timing.batch_size * front_advance(*front, 1 + max(outcome.accepted))
            seconds = timing.step_s + timing.proposal_s
            self.guard.record(timing.batch_size, tokens, seconds, timing.kv_len)
            if self.trees is not None and outcome.step in self._gated_steps:
                self.trees.record(timing.batch_size, any(outcome.private or ()), tokens, seconds)
        # (steps never learnt, e.g. a failed one, are dropped with this one)
        if self._gated_steps:
            self._gated_steps = {s for s in self._gated_steps if s > outcome.step}
        if timing is not None:
            self.controller.record(timing.batch_size, timing.width, timing.step_s, timing.asked,
                                   timing.propose_s, timing.after_idle_s, timing.packed_rows,
                                   timing.kv_len)
        for seq in outcome.finished:
            self.release(seq)


def closed_front(running: list[SpeculatingSequence]) -> int | None:
    """In a closed batch (every sequence :attr:`~RequestSpeculation.closes`): the most tokens
    left, less one, of any of its sequences (decoding or not), which is how many more plain
    steps the call takes, less one; None when the batch is not closed."""
    most = -1
    for seq in running:
        spec = seq.speculation
        if not spec.closes:
            return None
        left = spec.end - seq.num_tokens
        most = left if left > most else most
    return most


def front_advance(front: int, running: Sequence[SpeculatingSequence], most_made: int) -> int:
    """How far a closed batch's step brought the call's end nearer: ``front`` (:func:`closed_front`
    of ``running`` at the step's plan) less the most tokens left now among those of ``running``
    still unfinished (-1: none), and at most ``most_made``, the most tokens one sequence made in
    the step. A token that goes to a sequence that is not last moves nothing; a last sequence
    the step left out (preempted, over the token budget) moves it not at all; and a sequence
    that stops early (EOS, a stop string) would have shortened the call as much without drafts,
    so the credit is bounded by what the step itself made."""
    after = max((seq.speculation.end - seq.num_tokens for seq in running
                 if not seq.is_finished), default=-1)
    return max(0, min(front - after, most_made))
