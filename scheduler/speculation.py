"""The speculation controller's one interface, what a step tells it, and the fixed-k controller.

Each sequence has a *cap*: the configured ``num_speculative_tokens``, its request's own
``SamplingParams.num_speculative_tokens`` (0: this request does not speculate), and the drafts
that can still become output (``max_tokens``, the context length). A controller decides within
the caps, and the engine consults it at most three times a step:

1. :meth:`SpeculationController.plan` before scheduling: a :class:`DraftPlan`, the drafts each
   sequence asks the proposer for;
2. :meth:`SpeculationController.trim` after a *free* proposer (n-gram) answered, with its
   evidence: how many of each sequence's drafts to verify;
3. :meth:`SpeculationController.learn` with the step's :class:`StepOutcome` (acceptance, and a
   steady decode step's cost; an overlapped engine lets it learn a few steps' together).

:class:`FixedK` verifies every cap (``adaptive_k=False``); ``scheduler.spec_policy.GoodputPolicy``
chooses the drafts that maximise expected tokens per second. Seeded samples are steered like
the others: their tokens do not depend on how many drafts a step verifies
(``samplers.keyed_random``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from samplers.sampling_params import SamplingParams
from scheduler.acceptance import RequestAcceptance
from scheduler.scheduler import ScheduledSequence

NO_END = 1 << 62  # a request without max_tokens


class RequestSpeculation(RequestAcceptance):
    """One sequence's speculation state: its acceptance row, and what bounds its drafts (kept so
    that a step's caps cost one subtraction per sequence). ``limit``: the configured k and the
    request's own cap; ``end``: its last token's index at most (context length, max_tokens);
    ``cap``: the drafts it may verify at engine step ``step``; ``closes``: its caller waits for
    the whole batch and ``max_tokens`` bounds it (``scheduler.spec_policy``); ``critical``: it is
    among the sequences with the most tokens left this step (always, unless the batch is
    closed)."""

    __slots__ = ("limit", "end", "cap", "step", "closes", "critical")

    def __init__(self, row: int, limit: int, end: int, closes: bool = False) -> None:
        super().__init__(row)
        self.limit, self.end, self.closes = limit, end, closes
        self.cap, self.step, self.critical = 0, -1, True


class SpeculatingSequence(Protocol):
    """What a controller reads of a sequence (``engine.sequence.Sequence``)."""

    params: SamplingParams
    speculation: RequestSpeculation
    num_tokens: int
    num_prompt_tokens: int
    num_uncached_tokens: int

    @property
    def is_finished(self) -> bool: ...


def cap(seq: SpeculatingSequence) -> int:
    """The most drafts ``seq`` may verify now: the configured k, its request's own cap, and the
    drafts that can still become output (context length and max_tokens)."""
    spec = seq.speculation
    return max(0, min(spec.limit, spec.end - seq.num_tokens))


@dataclass(frozen=True)
class DraftPlan:
    """A step's drafts per sequence before proposing: up to ``width`` each, within its cap (0:
    nobody drafts)."""

    width: int
    step: int  # the controller's step number (a sequence's cap is fresh when its step is this)

    def refresh(self, running: list[SpeculatingSequence]) -> None:
        """The plan was made before the step before it committed (an overlapped engine plans
        while its last step is in flight): cut each planned sequence's cap to what its tokens
        allow now (its newest token may bring its end within the plan's drafts)."""
        for seq in running:
            spec = seq.speculation
            if spec.step == self.step:
                spec.cap = min(spec.cap, cap(seq))

    def drafts_for(self, seq: SpeculatingSequence) -> int:
        """The drafts ``seq`` asks the proposer for (what ``Scheduler.schedule`` budgets)."""
        if not self.width:
            return 0
        spec = seq.speculation
        if spec.step != self.step:  # (admitted this step, or no decision was made)
            spec.cap, spec.step, spec.critical = cap(seq), self.step, True
        return min(self.width, spec.cap)

    def drafts_ahead(self, seq: SpeculatingSequence, ahead: int) -> int:
        """:meth:`drafts_for` for a step launched while ``ahead`` of ``seq``'s tokens are still
        on the device (an overlapped engine): within the cap those tokens leave."""
        spec = seq.speculation
        return max(0, min(self.drafts_for(seq), spec.limit,
                          spec.end - seq.num_tokens - ahead))


@dataclass(frozen=True)
class StepTiming:
    """A steady decode step's cost (the engine leaves out prefills and steps whose graph bucket
    ran eager or was captured): ``step_s`` without the proposal; ``width``: 1 + the most drafts
    a sequence verified; ``asked``: the most drafts a sequence asked for, when the proposal was
    timed; ``propose_s``: the proposal's time when typical (None: e.g. a first look at a
    prompt); ``after_idle_s``: its time when it was the first after steps without one (a
    probe's); ``packed_rows``: the runner packed the step into that many rows; ``kv_len``: the
    step's longest context (step costs drift with it); ``proposal_s``: the proposal's time
    whatever its kind (0: none; what the payoff guard charges drafting with)."""

    batch_size: int
    width: int
    step_s: float
    asked: int
    propose_s: float | None
    after_idle_s: float | None
    packed_rows: int | None
    kv_len: int
    proposal_s: float = 0.0


@dataclass(frozen=True)
class StepOutcome:
    """What a step taught: for each verified sequence (a proposal was made), the drafts it
    verified (a tree's levels), how many were accepted, how many the proposer's evidence backed
    (None: all), and whether it verified a tree (``private``: its acceptance is its own);
    ``timing`` when the step was a steady decode step; ``finished``: the sequences that left in
    the step, released once their drafts are learnt; ``step``: the step's :class:`DraftPlan`
    ``step`` (what the controller recorded of that step's proposal goes with it)."""

    seqs: Sequence[SpeculatingSequence] = ()
    drafted: Sequence[int] = ()
    accepted: Sequence[int] = ()
    backed: Sequence[int | None] = ()
    private: Sequence[bool] | None = None
    timing: StepTiming | None = None
    finished: Sequence[SpeculatingSequence] = ()
    step: int = -1


class SpeculationController(Protocol):
    """What the engine calls (see the module docstring); plus a sequence's lifecycle."""

    max_k: int
    # ``learns``: :meth:`learn` reads the outcomes' costs (the engine times its steps on the
    # device for it only then)
    learns: bool

    def new_tracker(self, seq: SpeculatingSequence, together: bool = False
                    ) -> RequestSpeculation:
        """A new sequence's state (the engine keeps it as ``seq.speculation``); ``together``:
        its caller waits for every request it added at once (``LLM.generate``)."""

    def release(self, seq: SpeculatingSequence) -> None:
        """A sequence left the engine (finished, aborted, failed)."""

    def plan(self, running: list[SpeculatingSequence], waiting: bool) -> DraftPlan:
        """Before scheduling: the drafts to ask for; ``waiting``: requests wait for admission."""

    def trim(self, items: list[ScheduledSequence], drafted: list[int],
             num_backed: list[int] | None, others: tuple[int, int, int]) -> list[int]:
        """After a free proposer answered: how many of each item's ``drafted`` drafts (a
        tree's levels) to verify. ``others``: the step's sequences that asked for no drafts,
        as (how many, the most new tokens of one, their new tokens)."""

    def device_width(self, seqs: list[SpeculatingSequence], plan: DraftPlan,
                     ahead: int = 0) -> int:
        """A step of ``seqs`` whose drafts a proposer makes on the device after ``plan``
        (every sequence gets up to its cap, ``DraftPlan.drafts_ahead`` with ``ahead`` of its
        tokens still on the device; none is checked on the host): the most drafts a sequence
        verifies, 0 for a plain step instead."""

    def allows_tree(self, batch_size: int) -> bool:
        """While proposing a step of ``batch_size`` sequences that may draft trees: whether it
        does (else chains)."""

    def learn(self, outcome: StepOutcome, defer: bool = False) -> None:
        """The step's outcome; ``defer``: the engine's steps overlap, and it may be learnt
        with the next few (host time saved on the critical path)."""


def within_spare(counts: list[int], spare: int | None) -> list[int]:
    """``counts`` drafts cut, in order, to the KV cache's ``spare`` rows (None: no bound), so
    that a full cache preempts no one for a draft."""
    if spare is None:
        return list(counts)
    kept = []
    for count in counts:
        kept.append(max(0, min(count, spare)))
        spare -= kept[-1]
    return kept


def request_bounds(seq: SpeculatingSequence, max_k: int, max_model_len: int) -> tuple[int, int]:
    """``(limit, end)`` of a new sequence (see :class:`RequestSpeculation`)."""
    params = seq.params
    limit = max_k
    if params.num_speculative_tokens is not None:
        limit = min(limit, params.num_speculative_tokens)
    end = max_model_len
    if params.max_tokens is not None:
        end = min(end, seq.num_prompt_tokens + params.max_tokens)
    return max(limit, 0), end - 1


class FixedK:
    """Every sequence verifies its cap, every step (``adaptive_k=False``): nothing is learnt."""

    learns = False

    def __init__(self, max_k: int, max_model_len: int) -> None:
        self.max_k = max_k
        self.max_model_len = max_model_len
        self._step = 0

    def new_tracker(self, seq: SpeculatingSequence, together: bool = False
                    ) -> RequestSpeculation:
        limit, end = request_bounds(seq, self.max_k, self.max_model_len)
        return RequestSpeculation(-1, limit, end)

    def release(self, seq: SpeculatingSequence) -> None:
        pass

    def plan(self, running: list[SpeculatingSequence], waiting: bool) -> DraftPlan:
        self._step += 1
        return DraftPlan(self.max_k, self._step)

    def trim(self, items: list[ScheduledSequence], drafted: list[int],
             num_backed: list[int] | None, others: tuple[int, int, int]) -> list[int]:
        return [min(item.num_spec_tokens, d) for item, d in zip(items, drafted, strict=True)]

    def refresh(self, plan: DraftPlan, running: list[SpeculatingSequence]) -> None:
        """A plan made while the step before it was in flight, taken now: its caps cut to the
        sequences' tokens (:meth:`DraftPlan.refresh`)."""
        plan.refresh(running)

    def device_width(self, seqs: list[SpeculatingSequence], plan: DraftPlan,
                     ahead: int = 0) -> int:
        return max((plan.drafts_ahead(seq, ahead) for seq in seqs), default=0)

    def allows_tree(self, batch_size: int) -> bool:
        return True

    def learn(self, outcome: StepOutcome, defer: bool = False) -> None:
        pass


def make_controller(spec, max_k: int, max_model_len: int, **goodput_args):
    """The controller a ``SpeculativeConfig`` asks for: :class:`FixedK` without ``adaptive_k``
    (or with nothing to propose), else ``scheduler.spec_policy.GoodputPolicy``."""
    if spec is None or not spec.adaptive_k or not max_k:
        return FixedK(max_k, max_model_len)
    from scheduler.spec_policy import GoodputPolicy  # (it imports this module)

    return GoodputPolicy(spec, max_k, max_model_len, **goodput_args)
