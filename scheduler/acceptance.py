"""Acceptance per request and per draft position, with the proposer's evidence.

The controller (:mod:`scheduler.goodput`) needs, for each sequence of a step and each draft
position ``j``, the probability that draft ``j`` is accepted given that drafts ``1..j-1`` were:
the *conditional* acceptance ``a[j]``. The expected tokens of a step with ``w`` drafts are then
``1 + a[1] + a[1] a[2] + ... + a[1]...a[w]`` (with one ``a`` for all positions this is
Leviathan et al.'s ``(1 - a^(w+1)) / (1 - a)``, arXiv 2211.17192, eq. 1).

Evidence: a proposer may say how many of its leading drafts its own evidence backs
(``Proposal.num_backed``: an n-gram match of n tokens backs n drafts); backed and unbacked drafts
are counted apart, so that a long match predicts more accepted drafts than a guess past it.

Counts, per (backed, position): each request keeps its own, decayed by ``DECAY`` at each of its
verified steps so that they follow the text; the engine keeps the sum over all requests,
decayed by ``ENGINE_DECAY`` per request step. Evidence also ages while nobody drafts: an update
after a gap of ``g`` engine steps decays by a further ``DECAY ** ((g - 1) / IDLE_STEPS)``, so
that a long stretch of rejected drafts does not outweigh the probe that finds them accepted
again. Positions past the proposer's evidence are pooled (one rate for every unbacked draft). A
request's estimate is its own counts plus ``PRIOR_WEIGHT`` tested drafts at the engine's
*current* rate: a new request starts where the others are, and when a probe finds that drafts
pay again, every request sees it at once. The engine's rate of a backed position past the first
is shrunk toward the position before it by ``POSITION_PRIOR`` tries: a deep position is tested
only when the controller verifies that many drafts and the ones before it were accepted, so its
counts are few, and read alone one rejection can put it near 0 for good (the controller then
never verifies that many drafts again: docs/history.md, "The speculation controller", robust
step costs). ``found``: how often the proposer had a draft that its evidence backs for the
request (an n-gram proposer often has none), tracked the same way, per proposal.

Layout (host work is most of a small model's step on a GPU: docs/design.md, "Known gaps"; so a
step reads and updates the batch in a few array operations): each request is a row of
``counts [rows, 2, max_k + 2]`` (``HITS``/``TRIES``; columns ``0..max_k-1``: backed drafts by
position, ``max_k``: unbacked drafts pooled, ``max_k + 1``: proposals that found backed drafts /
proposals), the engine's counts are one more such ``[2, max_k + 2]``, and what one request's
verified step adds is looked up in a table by its (found, drafted, accepted, backed) code.
"""

from __future__ import annotations

import math
from itertools import chain
from operator import attrgetter
from typing import NamedTuple

import numpy as np

DECAY = 0.8  # per verified step of the request
ENGINE_DECAY = 0.95  # per request step, engine-wide
PRIOR_WEIGHT = 1.0  # tested drafts' worth of the engine's rate in a request's estimate
START_ACCEPTANCE = 0.8  # the engine's rate before anything was verified (optimistic: it drafts)
IDLE_STEPS = 4  # engine steps without an update that age the evidence like one update
POSITION_PRIOR = 1.0  # tries' worth of the position before it in a backed position's rate
EPSILON = 1e-6  # tested drafts' worth of START_ACCEPTANCE: a rate whose counts all decayed away
HITS, TRIES = 0, 1  # the two rows of a count: accepted (found) and tested (asked)
_row = attrgetter("row")


def expected_tokens(a: float, k: float) -> float:
    """Mean tokens one step yields with ``k`` drafts each accepted with probability ``a``:
    ``(1 - a^(k+1)) / (1 - a)`` (Leviathan et al., arXiv 2211.17192, eq. 1)."""
    if a >= 1.0:
        return k + 1.0
    return (1.0 - a ** (k + 1)) / (1.0 - a)


class RequestAcceptance:
    """A request's row in the :class:`AcceptanceModel`'s arrays (its counts live there, so that
    a step reads and updates the whole batch in a few array operations)."""

    __slots__ = ("row",)

    def __init__(self, row: int) -> None:
        self.row = row


class StepUpdate(NamedTuple):
    """One engine step for :meth:`AcceptanceModel.update_steps`: :meth:`AcceptanceModel.update`'s
    arguments, the proposals recorded before it (``(reqs, found)`` for
    :meth:`AcceptanceModel.record_proposals`; None: none) and the engine step (``clock``) it
    is learnt at."""

    reqs: list[RequestAcceptance]
    drafted: list[int]
    accepted: list[int]
    backed: list[int | None]
    private: list[bool] | None
    proposals: tuple[list[RequestAcceptance], list[int]] | None
    clock: int


class AcceptanceModel:
    """The engine's counts and every live request's, in rows of shared arrays (see the module
    docstring)."""

    def __init__(self, max_k: int, capacity: int = 64) -> None:
        self.max_k = k = max(max_k, 1)
        self.engine = np.zeros((2, k + 2))  # [2, max_k + 2]
        self.engine[HITS, :k + 1], self.engine[HITS, k + 1] = START_ACCEPTANCE, 1.0
        self.engine[TRIES] = 1.0
        self.clock = 0  # engine steps (tick)
        self.stamp = 0  # the engine step of the engine counts' last update with drafts
        self.version = 0  # bumped by every change of the counts
        self._engine_rates: np.ndarray | None = None  # engine_rates, until the counts change
        self._estimated: tuple[tuple[int, ...], int, np.ndarray, np.ndarray] | None = None
        # the last estimates: (rows, version, values, the first column's standard errors)
        self._raised: tuple[np.ndarray, float, np.ndarray] | None = None  # the last
        # optimistic(): (the estimates it raised [n, max_k + 2], spread, its answer, the same)
        self.counts = np.zeros((capacity, 2, k + 2))  # [rows, 2, max_k + 2]
        self.stamps = np.zeros(capacity, dtype=np.int64)  # [rows] step of the last drafts
        self.found = np.full(capacity, -1, dtype=np.int64)  # [rows] this step's proposal:
        # 1 found backed drafts, 0 found none, -1 not asked
        self._free = list(range(capacity - 1, -1, -1))
        self._tables()

    def _tables(self) -> None:
        """What a verified step adds, by ``code = ((found + 1) * K1 + d) * K1 + a) * K1 + b``
        (``K1 = max_k + 1``; ``d`` drafted, ``a <= d`` accepted, ``b <= d`` backed)."""
        k, k1 = self.max_k, self.max_k + 1
        self._found_stride = k1 ** 3
        codes = np.arange(3 * k1 ** 3)
        found, d, a, b = codes // k1 ** 3 - 1, codes // k1 ** 2 % k1, codes // k1 % k1, codes % k1
        pos = np.arange(k)[None, :]  # [1, max_k]
        tested = pos < np.minimum(a + 1, d)[:, None]  # [codes, max_k]
        hit = pos < a[:, None]  # [codes, max_k]
        backed = pos < b[:, None]  # [codes, max_k]
        add = np.zeros((len(codes), 2, k + 2))  # [codes, 2, max_k + 2]
        add[:, HITS, :k], add[:, TRIES, :k] = hit & backed, tested & backed
        add[:, HITS, k], add[:, TRIES, k] = (hit & ~backed).sum(1), (tested & ~backed).sum(1)
        add[:, HITS, k + 1], add[:, TRIES, k + 1] = found == 1, found >= 0
        self._add = add
        self._drafted = d > 0  # [codes]
        self._asked = found >= 0  # [codes]

    def tick(self) -> None:
        """One engine step begins."""
        self.clock += 1

    def new_request(self) -> RequestAcceptance:
        return RequestAcceptance(self.new_row())

    def new_row(self) -> int:
        """A free row, cleared (for a request's :class:`RequestAcceptance`)."""
        if not self._free:
            self._grow()
        row = self._free.pop()
        self.version += 1  # (a cached estimate of the row's last request must not be reused)
        self.counts[row] = 0.0
        self.found[row] = -1
        self.stamps[row] = self.clock
        return row

    def release(self, req: RequestAcceptance) -> None:
        """The request finished: its row is free for another."""
        self._release(req)

    def _release(self, req: RequestAcceptance) -> None:
        if req.row >= 0:
            self._free.append(req.row)
            req.row = -1

    def _grow(self) -> None:
        old = len(self.stamps)
        self.counts = np.concatenate([self.counts, np.zeros_like(self.counts)])
        self.stamps = np.concatenate([self.stamps, np.zeros_like(self.stamps)])
        self.found = np.concatenate([self.found, np.full_like(self.found, -1)])
        self._free.extend(range(2 * old - 1, old - 1, -1))

    @staticmethod
    def _rows(reqs: list[RequestAcceptance]) -> np.ndarray:
        """``[len(reqs)]`` the requests' rows."""
        return np.fromiter(map(_row, reqs), dtype=np.int64, count=len(reqs))

    @property
    def engine_rates(self) -> np.ndarray:
        """``[max_k + 2]`` the engine's current rates (columns as the counts'); each backed
        position past the first is shrunk toward the position before it by
        ``POSITION_PRIOR`` tries (see the module docstring). Read only; worked out when first
        read after the counts changed (an overlapped engine learns a few steps before it
        estimates)."""
        if self._engine_rates is None:
            self._engine_rates = self._rates_of_engine()
        return self._engine_rates

    def _rates_of_engine(self) -> np.ndarray:
        """:attr:`engine_rates`, worked out."""
        rates = ((self.engine[HITS] + EPSILON * START_ACCEPTANCE)
                 / (self.engine[TRIES] + EPSILON))  # [max_k + 2]
        hits, tries = self.engine[HITS], self.engine[TRIES]
        for j in range(1, self.max_k):
            rates[j] = (hits[j] + POSITION_PRIOR * rates[j - 1]) / (tries[j] + POSITION_PRIOR)
        return rates

    def estimates(self, reqs: list[RequestAcceptance]) -> np.ndarray:
        """``[len(reqs), max_k + 2]`` each request's rates, columns as the counts': its own
        counts plus ``PRIOR_WEIGHT`` tries at the engine's rate. Read only: the same requests'
        estimates are reused until the counts change (a step plans, then chooses its width)."""
        return self._estimate(reqs)[0]

    def _estimate(self, reqs: list[RequestAcceptance]) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`estimates` and the standard errors of their first column ``[len(reqs)]``
        (the only one :meth:`optimistic` raises; a rate ``r`` of ``n`` tries, the prior's
        included: the binomial ``sqrt(r (1 - r) / n)``, 0 at a rate of 0, so that drafts that
        are never accepted are not kept up by it)."""
        rows = tuple(map(_row, reqs))
        last = self._estimated
        if last is not None and last[1] == self.version and last[0] == rows:
            return last[2], last[3]
        counts = self.counts[np.array(rows, dtype=np.int64)]  # [n, 2, max_k + 2]
        tries = counts[:, TRIES] + PRIOR_WEIGHT  # [n, max_k + 2]
        values = (counts[:, HITS] + PRIOR_WEIGHT * self.engine_rates) / tries
        first = values[:, 0]  # [n]
        errors = np.sqrt(first * (1.0 - first) / tries[:, 0])  # [n]
        self._estimated = (rows, self.version, values, errors)
        return values, errors

    def untested_share(self, reqs: list[RequestAcceptance]) -> float:
        """The share of ``reqs`` that were never tested: no draft of theirs verified and no
        proposal asked for them (their estimates are the engine's rate alone: text the
        controller has not measured). A request whose proposals found nothing was tested: an
        n-gram proposer that never matches it would otherwise keep it new for good."""
        if not reqs:
            return 0.0
        tries = self.counts[self._rows(reqs), TRIES]  # [n, max_k + 2]
        return float(np.count_nonzero(~tries.any(axis=1))) / len(reqs)

    def optimistic(self, reqs: list[RequestAcceptance], spread: float) -> np.ndarray:
        """``[len(reqs), max_k + 2]``: :meth:`estimates` with the first draft's rate raised by
        ``spread`` standard errors, at most 1 (an upper confidence bound: see
        ``scheduler.goodput``, "Decisions under uncertainty"; read only, kept like the
        estimates). Only the first: every drafting step tests it, and it gates the rest; a
        later position that is seldom reached keeps its estimate (an untested one reads the
        engine's optimistic start, and raising both would count the same doubt twice)."""
        values, errors = self._estimate(reqs)
        if not spread:
            return values
        last = self._raised
        if last is not None and last[0] is values and last[1] == spread:
            return last[2]
        out = values.copy()
        out[:, 0] = np.minimum(values[:, 0] + spread * errors, 1.0)
        self._raised = (values, spread, out)
        return out

    def rates(self, reqs: list[RequestAcceptance], backed: list[int] | None = None,
              estimates: np.ndarray | None = None) -> np.ndarray:
        """``[len(reqs), max_k]`` conditional acceptance of each request's draft positions;
        positions past ``backed[i]`` read the pooled unbacked rate (None: all backed).
        ``estimates``: this step's :meth:`estimates` of ``reqs`` (or :meth:`optimistic`
        ones), if taken already."""
        est = self.estimates(reqs) if estimates is None else estimates
        k = self.max_k
        if backed is None:
            return est[:, :k].copy()
        unbacked = np.arange(k)[None, :] >= np.asarray(backed)[:, None]  # [n, max_k]
        return np.where(unbacked, est[:, k:k + 1], est[:, :k])

    def record_proposals(self, reqs: list[RequestAcceptance], found: list[int]) -> None:
        """One proposal for each of ``reqs``; ``found[i] > 0``: it had drafts it backs (counted
        with the step's :meth:`update`)."""
        self._record_proposals(reqs, found)

    def _record_proposals(self, reqs: list[RequestAcceptance], found: list[int]) -> None:
        self.found[self._rows(reqs)] = np.asarray(found) > 0

    def _live_rows(self, reqs: list[RequestAcceptance]) -> np.ndarray:
        """``[len(reqs)]`` the rows of requests to update (a released one's raises)."""
        rows = self._rows(reqs)
        if len(rows) and rows.min() < 0:
            raise ValueError("AcceptanceModel.update: a request whose row was released (it "
                             "left the engine) cannot be updated")
        return rows

    def _codes(self, num_drafted: list[int], num_accepted: list[int],
               num_backed: list[int | None]) -> np.ndarray:
        """``[n]`` each verified step's code in ``_add`` before its proposal's (``found``)
        part: ``(d * K1 + a) * K1 + b`` (see :meth:`_tables`), ``a`` and ``b`` capped at
        ``d``, a ``b`` of None read as ``d``. In array operations, not a Python loop a step:
        an overlapped engine's controller codes a batch's few steps at once, every entry on
        the critical path (docs/design.md, "The speculation controller")."""
        k1 = self.max_k + 1
        d = np.array(num_drafted, dtype=np.int64)  # [n]
        a = np.minimum(np.array(num_accepted, dtype=np.int64), d)  # [n]
        if None in num_backed:  # (None: every draft backed)
            b = np.array([x if x is not None else k1 for x in num_backed], dtype=np.int64)
        else:
            b = np.array(num_backed, dtype=np.int64)
        return (d * k1 + a) * k1 + np.minimum(b, d)

    def update(self, reqs: list[RequestAcceptance], num_drafted: list[int],
               num_accepted: list[int], num_backed: list[int | None],
               private: list[bool] | None = None) -> None:
        """One verified step of each of ``reqs``: drafts ``1..num_accepted`` were accepted and,
        when one was rejected, draft ``num_accepted + 1`` was tested and failed; later ones were
        not tested (``num_backed[i]`` None: all backed). The step's proposals
        (:meth:`record_proposals`) are counted too. A request's acceptance counts decay only at
        its steps with drafts. ``private[i]``: request ``i``'s step counts for its own row only,
        not for the engine's rate that new requests start from (a draft tree's acceptance,
        which the chains of larger batches do not reach)."""
        self._update(reqs, num_drafted, num_accepted, num_backed, private)

    def _update(self, reqs: list[RequestAcceptance], num_drafted: list[int],
                num_accepted: list[int], num_backed: list[int | None],
                private: list[bool] | None) -> None:
        n, k1 = len(reqs), self.max_k + 1
        rows = self._live_rows(reqs)
        codes = self._codes(num_drafted, num_accepted, num_backed)
        codes += (self.found[rows] + 1) * self._found_stride
        self.found[rows] = -1
        drafted, asked = self._drafted[codes], self._asked[codes]  # [n] each
        num_drafting, num_asked = int(np.count_nonzero(drafted)), int(np.count_nonzero(asked))
        if not num_drafting and not num_asked:
            return
        shared = None if private is None or not any(private) else ~np.asarray(private, bool)
        self.version += 1
        stamps = self.stamps[rows]  # [n]
        age = DECAY ** (np.maximum(self.clock - stamps - 1, 0) / IDLE_STEPS)  # [n]
        mult = np.empty((n, 1, k1 + 1))  # [n, 1, max_k + 2]
        mult[:, 0, :k1] = np.where(drafted, DECAY * age, 1.0)[:, None]
        mult[:, 0, k1] = np.where(asked, DECAY, 1.0)
        add = self._add[codes]  # [n, 2, max_k + 2]
        self.counts[rows] = self.counts[rows] * mult + add
        self.stamps[rows] = np.where(drafted, self.clock, stamps)
        if shared is not None:  # (the engine's rate learns from the shared steps only)
            add, drafted, asked = add[shared], drafted[shared], asked[shared]
            num_drafting = int(np.count_nonzero(drafted))
            num_asked = int(np.count_nonzero(asked))
        engine_mult = np.empty(k1 + 1)  # [max_k + 2]
        engine_mult[:k1] = 1.0
        if num_drafting:
            engine_age = DECAY ** (max(self.clock - self.stamp - 1, 0) / IDLE_STEPS)
            engine_mult[:k1] = ENGINE_DECAY ** num_drafting * engine_age
            self.stamp = self.clock
        engine_mult[k1] = ENGINE_DECAY ** num_asked
        self.engine = self.engine * engine_mult + add.sum(0)
        self._engine_rates = None

    def update_steps(self, steps: list[StepUpdate]) -> None:
        """Several engine steps' updates at once, in order, each with the proposals
        recorded before it and at the engine step it was learnt at (``StepUpdate``): what
        calling :meth:`record_proposals` and :meth:`update` for each in turn at those clocks
        gives (tested), in a fixed number of array operations (an overlapped engine learns a
        few steps together: host time there is on the critical path).

        Closed form: a request's counts go ``c <- c * m_t + add_t`` at each of its steps
        (``m_t``: its decay then, by column), so after them ``c * prod(m) + sum_t add_t *
        prod(m after t)``, the products read as sums of logarithms over each request's entries
        in step order; the engine's counts likewise, one step at a time (a few steps)."""
        if (all(step.proposals is None and not any(step.drafted) for step in steps)
                and not (self.found >= 0).any()):
            return  # (plain steps and no proposal waiting: nothing to count)
        sizes = [len(step.reqs) for step in steps]
        if not any(sizes):  # (only proposals: counted with their requests' next updates)
            for step in steps:
                if step.proposals is not None:
                    self._record_proposals(*step.proposals)
            return
        k1 = self.max_k + 1
        # [E] each: every step's entries, in step order (one conversion for all of them)
        rows = self._live_rows(list(chain.from_iterable(step.reqs for step in steps)))
        codes = self._codes(list(chain.from_iterable(step.drafted for step in steps)),
                            list(chain.from_iterable(step.accepted for step in steps)),
                            list(chain.from_iterable(step.backed for step in steps)))
        if any(step.proposals is not None for step in steps) or (self.found >= 0).any():
            found = np.empty(len(rows), dtype=np.int64)  # [E] (proposals: in step order)
            at = 0
            for step, size in zip(steps, sizes, strict=True):
                if step.proposals is not None:
                    self._record_proposals(*step.proposals)
                found[at:at + size] = self.found[rows[at:at + size]]
                self.found[rows[at:at + size]] = -1
                at += size
            codes += (found + 1) * self._found_stride
        drafted, asked = self._drafted[codes], self._asked[codes]  # [E] each
        if not drafted.any() and not asked.any():
            return
        self.version += 1
        clocks = np.repeat([step.clock for step in steps], sizes)  # [E]
        add = self._add[codes]  # [E, 2, max_k + 2]
        self._update_rows(rows, clocks, drafted, asked, add)
        steps, sizes = zip(*[(step, size) for step, size in zip(steps, sizes, strict=True)
                             if size], strict=True)  # (the engine learns from these)
        shared = np.concatenate([np.ones(size, bool) if step.private is None
                                 else ~np.asarray(step.private, bool)
                                 for step, size in zip(steps, sizes, strict=True)])  # [E]
        starts = np.cumsum([0, *sizes[:-1]])  # [steps] each step's first entry
        per_step = np.add.reduceat(add * shared[:, None, None], starts)  # [steps, 2, max_k + 2]
        num_drafting = np.add.reduceat((drafted & shared).astype(np.int64), starts).tolist()
        num_asked = np.add.reduceat((asked & shared).astype(np.int64), starts).tolist()
        engine = self.engine
        for step, adds, d, a in zip(steps, per_step, num_drafting, num_asked, strict=True):
            engine_mult = np.ones(k1 + 1)  # [max_k + 2]
            if d:
                engine_age = DECAY ** (max(step.clock - self.stamp - 1, 0) / IDLE_STEPS)
                engine_mult[:k1] = ENGINE_DECAY ** d * engine_age
                self.stamp = step.clock
            engine_mult[k1] = ENGINE_DECAY ** a
            engine = engine * engine_mult + adds
        self.engine = engine
        self._engine_rates = None

    def _update_rows(self, rows: np.ndarray, clocks: np.ndarray, drafted: np.ndarray,
                     asked: np.ndarray, add: np.ndarray) -> None:
        """The requests' counts after the entries ``[E]`` of several steps (in step order): for
        each, its row, the engine step it was learnt at, whether it verified drafts and
        whether it was asked for a proposal, and what it adds ``[E, 2, max_k + 2]``."""
        k1 = self.max_k + 1
        order = np.argsort(rows, kind="stable")  # (each request's entries stay in step order)
        rows, clocks, drafted, asked = rows[order], clocks[order], drafted[order], asked[order]
        add = add[order]
        n = len(rows)
        first = np.empty(n, bool)  # [E] a request's first entry
        first[0] = True
        np.not_equal(rows[1:], rows[:-1], out=first[1:])
        starts = np.flatnonzero(first)  # [G] each request's first entry
        group = np.cumsum(first) - 1  # [E] its request's index in starts
        # The engine step of each entry's request's last drafting step before it: the
        # running maximum within the request (offset by request, so it restarts at each)
        offset = group * (int(clocks.max()) + 2)  # [E]
        marked = np.where(drafted, clocks, -1) + offset  # [E]
        before = np.maximum.accumulate(marked) - offset  # [E] including the entry itself
        stamp = np.empty(n, dtype=np.int64)  # [E] excluding it
        stamp[0] = -1
        stamp[1:] = np.where(first[1:], -1, before[:-1])
        stamp = np.maximum(stamp, self.stamps[rows])
        age = DECAY ** (np.maximum(clocks - stamp - 1, 0) / IDLE_STEPS)  # [E]
        log_mult = np.zeros((n, k1 + 1))  # [E, max_k + 2] log of each entry's decay
        log_mult[:, :k1] = np.where(drafted, math.log(DECAY) + np.log(age), 0.0)[:, None]
        log_mult[:, k1] = np.where(asked, math.log(DECAY), 0.0)
        # suffix sums within each request: the decay its later entries apply to an entry's
        suffix = np.cumsum(log_mult[::-1], axis=0)[::-1]  # [E, max_k + 2] to the array's end
        ends = np.append(starts[1:], n)  # [G] one past each request's last entry
        after_group = np.vstack([suffix, np.zeros((1, k1 + 1))])[ends]  # [G, max_k + 2]
        later = np.exp(suffix - log_mult - after_group[group])  # [E, max_k + 2]
        whole = np.exp(suffix[starts] - after_group)  # [G, max_k + 2]
        unique = rows[starts]  # [G]
        self.counts[unique] = (self.counts[unique] * whole[:, None, :]
                               + np.add.reduceat(add * later[:, None, :], starts))
        last = np.maximum.reduceat(np.where(drafted, clocks, -1), starts)  # [G]
        self.stamps[unique] = np.maximum(self.stamps[unique], last)
