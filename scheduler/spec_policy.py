"""How many drafts each sequence of an engine step gets: the engine's side of the controller.

Each sequence has a *cap*: the configured ``num_speculative_tokens``, its request's own
``SamplingParams.num_speculative_tokens`` (0: this request does not speculate), and the drafts
that can still become output (``max_tokens``, the context length). Within the caps the goodput
controller (:mod:`scheduler.goodput`) decides; with ``adaptive_k`` off every sequence verifies
its cap. Seeded samples are steered like the others: their tokens do not depend on how many
drafts a step verifies (``samplers.keyed_random``).

A batch whose caller waits for all of it (``LLM.generate``: the call returns when its last
request finishes) is *closed* once nothing waits to be admitted and each running request has a
``max_tokens``: a token then shortens the call only when it goes to a sequence with the most
tokens left (unless a stop, such as EOS, ends the others first). So in a closed batch the
controller weighs only the *critical* sequences, the decoding ones within ``max_k`` tokens of
the most left (a step can move any of them to the front; a sequence still in its prefill cannot
draft yet and is left out); the others still verify drafts in the steps it widens. Measured
on the H100 with the default model (32 open-ended prompts of 128 tokens each, n-gram): without
it the controller drafted in up to 20 of 128 steps for sequences that finished early, the batch
still took 128 steps, and it ran at 0.91-0.93 of the engine without speculation. A server's
requests are not closed: each one's own finish counts.

The engine calls, per step: :meth:`SpeculationPolicy.begin_step` (before scheduling),
:meth:`~SpeculationPolicy.num_spec_tokens` (drafts to ask for, per sequence),
:meth:`~SpeculationPolicy.kept_drafts` (after proposing: how many to verify, within the KV
cache's room), :meth:`~SpeculationPolicy.update` (per verified sequence) and
:meth:`~SpeculationPolicy.record_step` (the step's times).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from samplers.sampling_params import SamplingParams
from scheduler.acceptance import RequestAcceptance
from scheduler.goodput import GoodputController, PackedRows
from scheduler.scheduler import ScheduledSequence

NO_END = 1 << 62  # a request without max_tokens


class RequestSpeculation(RequestAcceptance):
    """One sequence's speculation state: its acceptance row, and what bounds its drafts (kept so
    that a step's caps cost one subtraction per sequence). ``limit``: the configured k and the
    request's own cap; ``end``: its last token's index at most (context length, max_tokens);
    ``cap``: the drafts it may verify at engine step ``step``; ``closes``: its caller waits for
    the whole batch and ``max_tokens`` bounds it (see the module docstring); ``critical``: it is
    among the sequences with the most tokens left this step (always, unless the batch is
    closed)."""

    __slots__ = ("limit", "end", "cap", "step", "closes", "critical")

    def __init__(self, row: int, limit: int, end: int, closes: bool = False) -> None:
        super().__init__(row)
        self.limit, self.end, self.closes = limit, end, closes
        self.cap, self.step, self.critical = 0, -1, True


class SpeculationOptions(Protocol):
    """The knobs of ``engine.config.SpeculativeConfig`` that the policy reads."""

    adaptive_k: bool
    verify_cost_per_token: float | None
    draft_cost_ratio: float | None
    adaptive_probe_interval: int


class SpeculatingSequence(Protocol):
    """What the policy reads of a sequence (``engine.sequence.Sequence``)."""

    params: SamplingParams
    speculation: RequestSpeculation
    num_tokens: int
    num_prompt_tokens: int
    num_uncached_tokens: int


class SpeculationPolicy:
    """The engine's choice of drafts, step by step (see the module docstring). ``max_k`` is 0
    when nothing proposes; ``drafts_are_free``: the proposer's drafts cost next to nothing
    (n-gram); ``measured_draft_cost()``: the measured draft/target step-cost ratio, the prior
    of a costly proposer's cost until its proposals are timed; ``packed_rows``: the runner's
    rule for packing a step of unequal rows (``ModelRunner.packed_rows``; None: never)."""

    def __init__(self, spec: SpeculationOptions | None, max_k: int, max_model_len: int,
                 drafts_are_free: bool, measured_draft_cost: Callable[[], float],
                 batch_bucket: Callable[[int], int] = int,
                 packed_rows: PackedRows | None = None) -> None:
        self.max_k = max_k
        self.max_model_len = max_model_len
        self.measured_draft_cost = measured_draft_cost
        self.adaptive = bool(spec is not None and spec.adaptive_k and max_k)
        self.free = drafts_are_free
        self.controller = GoodputController(
            max_k, drafts_are_free, spec.adaptive_probe_interval if spec else 1,
            spec.verify_cost_per_token if spec else None, spec.draft_cost_ratio if spec else None,
            batch_bucket, packed_rows)
        self._step_k = 0  # drafts asked for this step by the sequences the controller steers
        self._step = 0  # engine steps begun (a sequence's cap is fresh when its step is this)
        self._batch_size = 0  # the running sequences at this step's begin_step (its cost's)
        self._idle: tuple[list[SpeculatingSequence], bool, int] | None = None  # the last
        # step's running sequences, waiting flag and acceptance version, when it drafted none
        self._records: list[tuple] = []  # deferred record_step()s (see flush)

    def new_tracker(self, seq: SpeculatingSequence, together: bool = False) -> RequestSpeculation:
        """The state of a new sequence (the engine keeps it as ``seq.speculation``);
        ``together``: its caller waits for every request it added at once (``LLM.generate``)."""
        params = seq.params
        limit = self.max_k
        if params.num_speculative_tokens is not None:
            limit = min(limit, params.num_speculative_tokens)
        end = self.max_model_len
        if params.max_tokens is not None:
            end = min(end, seq.num_prompt_tokens + params.max_tokens)
        return RequestSpeculation(self.controller.acceptance.new_row(), max(limit, 0), end - 1,
                                  together and params.max_tokens is not None)

    @staticmethod
    def cap(seq: SpeculatingSequence) -> int:
        """The most drafts ``seq`` may verify this step: the configured k, its request's own
        cap, and the drafts that can still become output (context length and max_tokens)."""
        spec = seq.speculation
        return max(0, min(spec.limit, spec.end - seq.num_tokens))

    def begin_step(self, running: list[SpeculatingSequence], waiting: bool = False) -> None:
        """Decide this step's drafts for the running sequences (newcomers' prefills draft
        nothing that the decision would change); ``waiting``: requests wait to be admitted
        (then the batch is not closed: see the module docstring)."""
        self._step += 1
        if not self.adaptive:  # (every sequence its cap, a newcomer's prefill included)
            self._step_k = self.max_k
            return
        if not running:
            self._step_k = 0
            return
        if (self._idle is not None and running == self._idle[0]
                and (waiting, self.controller.acceptance.version) == self._idle[1:]):
            # The same sequences as the last step, all decoding then, which drafted nothing,
            # and nothing learnt since: each one's tokens left went down by one (unless the
            # token budget skipped one), so the answer is still none (a cap only shrinks, and
            # who has the most tokens left is who had them), save a probe; at worst a change is
            # seen at the next probe, within ``adaptive_probe_interval`` steps.
            self._step_k = self.controller.plan_idle()
            if self._step_k:
                self._idle = None
            return
        steered: list[RequestSpeculation] = []
        caps: list[int] = []
        step, closed = self._step, not waiting
        self._batch_size = len(running)
        for seq in running:
            spec = seq.speculation
            spec.cap = cap = self.cap(seq)
            spec.step, spec.critical = step, True
            closed = closed and spec.closes
            steered.append(spec)
            caps.append(cap)
        critical = self._critical(running) if closed and len(running) > 1 else None
        # (the step less the drafts: every sequence decodes; a prompt chunk's step is not
        # packed, and is not priced as one)
        n = len(running)
        longest = max(seq.num_uncached_tokens for seq in running)
        layout = (n, longest, n) if longest == 1 else None
        self._step_k = self.controller.plan(steered, caps, 0, self.measured_draft_cost(),
                                            critical, n, layout)
        self._idle = None
        if (self.controller.settled
                and all(seq.num_uncached_tokens == 1 for seq in running)):
            self._idle = (list(running), waiting, self.controller.acceptance.version)

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

    def num_spec_tokens(self, seq: SpeculatingSequence) -> int:
        """The drafts ``seq`` asks the proposer for this step."""
        spec = seq.speculation
        if not self._step_k:
            return 0
        if spec.step != self._step:  # (admitted this step, or no decision was made)
            spec.cap, spec.step, spec.critical = self.cap(seq), self._step, True
        return min(self._step_k, spec.cap)

    def kept_drafts(self, items: list[ScheduledSequence], draft_token_ids: list[list[int]],
                    num_backed: list[int] | None, free_kv_tokens: int | None,
                    others: tuple[int, int, int] = (0, 0, 0)) -> list[int]:
        """How many of each item's drafts to verify. A free proposer was asked for each cap:
        the controller now picks the step's width with the proposer's evidence (``num_backed``,
        see :attr:`proposers.Proposal.num_backed`), and every steered sequence verifies its
        drafts up to it. Drafts past the KV cache's spare rows
        (``free_kv_tokens`` less the step's tokens) are cut, so a full cache preempts no one.
        ``others``: the step's sequences that asked for no drafts, as (how many, the most new
        tokens of one, their new tokens): with ``items`` they lay out the step, which the
        controller prices."""
        got = [min(item.num_spec_tokens, len(d)) for item, d in zip(items, draft_token_ids,
                                                                        strict=True)]
        if self.adaptive and self.free:
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
                (len(items) + num_others, longest, total))
            got = [min(g, width) for g in got]
        if free_kv_tokens is not None:
            spare = free_kv_tokens - sum(item.num_context_tokens for item in items)
            for i, g in enumerate(got):
                got[i] = max(0, min(g, spare))
                spare -= got[i]
        return got

    def record_step(self, items: list[ScheduledSequence], drafts: list[list[int]],
                    step_s: float, propose_s: float | None,
                    after_idle_s: float | None = None, packed_rows: int | None = None,
                    kv: int = 0) -> None:
        """A steady decode step's time (the engine leaves out prefills and steps whose graph
        bucket ran eager or was captured): ``step_s`` without the proposal, ``propose_s`` (None:
        not typical, e.g. the proposer's first look at a prompt); ``after_idle_s``: the
        proposal's time when it was the first after steps without one (a probe's);
        ``packed_rows``: the runner packed the step into that many rows; ``kv``: the step's
        context (its longest sequence's tokens: step costs drift with it)."""
        if not self.adaptive or not items:
            return
        width = 1 + max(map(len, drafts))
        timed = propose_s is not None or after_idle_s is not None
        asked = max(item.num_spec_tokens for item in items) if timed else 0
        args = (len(items), width, step_s, asked, propose_s, after_idle_s, packed_rows, kv)
        if self.defer_updates:
            self._records.append(args)
        else:
            self.controller.record(*args)

    def update(self, seqs: list[SpeculatingSequence], num_drafted: list[int],
               num_accepted: list[int], num_backed: list[int | None],
               private: list[bool] | None = None) -> None:
        """The step's verified sequences, at once (``private[i]``: a draft tree's step, which
        counts for its own sequence only: ``AcceptanceModel.update``)."""
        if self.adaptive:
            self.controller.acceptance.update([seq.speculation for seq in seqs], num_drafted,
                                              num_accepted, num_backed, private)

    @property
    def defer_updates(self) -> bool:
        """Learning waits for :meth:`flush` (a GPU engine: see there)."""
        return self.controller.acceptance.deferred

    @defer_updates.setter
    def defer_updates(self, value: bool) -> None:
        if not value:
            self.flush()  # (what was held back is learnt now: nothing stays queued)
        self.controller.acceptance.deferred = value

    def flush(self) -> None:
        """Learn what the steps since the last flush taught (their acceptance, their costs),
        free the rows of the sequences that left meanwhile, and prepare the next decision
        (the estimates of the last one's sequences, the step costs at its batch size, and the
        width itself where the drafts stay the same: ``GoodputController.prepare``). The
        engine calls it while the target's forward runs on the GPU: host time that costs
        nothing there, where a step of a small model is 4 ms and the controller's learning
        took 0.2-0.3 ms of it on the H100 machine's host."""
        if not self.defer_updates:
            return
        self.controller.acceptance.flush()
        records, self._records = self._records, []
        for args in records:
            self.controller.record(*args)
        self.controller.prepare(self._batch_size)

    def release(self, seq: SpeculatingSequence) -> None:
        """A sequence left the engine (finished, aborted): its acceptance row is free."""
        self.controller.acceptance.release(seq.speculation)
