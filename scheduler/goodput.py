"""The goodput controller: each step's drafts maximise expected tokens per second.

Model. A step of ``b`` sequences whose longest verifies ``w`` drafts costs ``C(w)`` plain steps
(measured: :mod:`scheduler.step_costs`; the runner pads every sequence to the step's longest,
or packs a step of unequal drafts one token a row, priced by
:meth:`GoodputController.packed_cost`) and yields ``E(w) = sum_i (1 + a_i[1] + a_i[1] a_i[2] +
...)`` tokens, each sum taken up to that sequence's own drafts (at most ``w``, at most its cap),
from the conditional acceptance per request and position of :mod:`scheduler.acceptance`.

Decision rule. The ``w`` of largest goodput ``E(w) / C(w)``; ``w = 0`` (plain decoding: ``b``
tokens for one plain step) wins unless drafting beats it by ``MARGIN``, and a width is taken
only when at least half of the step's sequences expect ``C(w)`` tokens from it
(:func:`typical_tokens`): every sequence pays the step's cost, so a gain of a few sequences must
not slow the typical one, nor the end of a batch. A free proposer (``Proposer.drafts_are_free``:
n-gram) is asked for every sequence's cap when calling it pays, and ``w`` is chosen after it
answered, with its backed drafts as evidence (:meth:`GoodputController.choose_width`); a
costly one has ``k`` chosen before it runs, its measured time in the cost
(:meth:`GoodputController.plan`).

Uncertainty. While drafting, the first draft's rate is read ``CONFIDENCE`` standard errors high,
over ``sqrt(b)`` (the sequences' errors add in quadrature), so that a noisy estimate (a request's
rate comes from a few decayed steps) does not stop drafts that pay; to start drafting again the
estimates are read as they are (the binomial error vanishes at a rate of 0: at acceptance 0 the
drafts stop). Costs not measured are optimistic, so that a width is tried and then judged on its
own cost: a width between trusted ones lies on the line through them, one past the widest costs
what that one does, and with none measured ``1 + DEFAULT_VERIFY_COST * (w - 1)``; a width with
fewer than ``TRUSTED`` samples costs what the next narrower one does; trusted costs are pooled
to be non-decreasing in the width (:func:`monotone_fit`).

Probes. While drafting does not pay, a probe drafts anyway (the full cap of free drafts, or one
costly draft) once its wait is over: the wait keeps the probes' expected overhead at
``PROBE_BUDGET`` of the time (a probe 10% dearer than a plain step comes every 10 steps), at
least ``MIN_PROBE_WAIT`` and at most ``max_wait`` (``SpeculativeConfig.adaptive_probe_interval``)
times the probe's cost in whole plain steps. The wait is a ``FRESH_WAIT_DIVISOR``-th when at
least ``FRESH_SHARE`` of the weighed sequences were never tested (new text may have brought a
drift), and once after drafting stops (the stop may be the estimate's noise).

On a GPU the controller learns while the next step's forward runs (``learn`` and
:meth:`GoodputController.prepare`, from :mod:`scheduler.spec_policy`), so a decision sees the
steps before the last one. Why each rule, and what it was measured to gain: docs/design.md, "The
speculation controller" and "Measured reasons behind the runner's choices". One module, past 400
lines, because it is one object: the decisions, the probes' state and the cost reads share caches
keyed by the cost table's and the acceptance's versions.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from itertools import compress
from operator import attrgetter

import numpy as np

from scheduler.acceptance import AcceptanceModel, RequestAcceptance
from scheduler.step_costs import TRUSTED, StepCostTable

_row = attrgetter("row")
DEFAULT_VERIFY_COST = 0.1  # one more scored token per sequence / a plain step, until measured
MARGIN = 0.02  # drafting must beat plain decoding by this fraction of its goodput
PROBE_BUDGET = 0.01  # the probes' expected overhead, as a fraction of plain decoding's time
MIN_PROBE_WAIT = 2
FRESH_WAIT_DIVISOR = 4  # a step of mostly untested sequences probes this much sooner
FRESH_SHARE = 0.5  # ... where at least this share of its weighed sequences is untested
CONFIDENCE = 1.5  # standard errors of the step's expected tokens added (see the docstring)
MIN_PLAIN_SAMPLES = 2  # plain steps measured at a batch size before its costs are relative
PLAIN_EVERY = 4  # while a batch size lacks them, at most every this many steps is made plain


def confidence_spread(batch_size: int) -> float:
    """Standard errors added to each sequence's acceptance estimates in a step of
    ``batch_size`` sequences: ``CONFIDENCE / sqrt(batch_size)``, so that the step's expected
    tokens are raised by about ``CONFIDENCE`` standard errors of their sum (the errors of
    independent sequences add in quadrature)."""
    return CONFIDENCE / math.sqrt(max(batch_size, 1))


def sequence_tokens(rates: np.ndarray, avail: np.ndarray | list[int]) -> np.ndarray:
    """``[n, max_k + 1]``: ``E_i[w]``, the expected tokens of sequence ``i`` when it verifies
    ``min(w, avail[i])`` drafts, ``w = 0..max_k``. ``rates [n, max_k]``: conditional
    acceptance; ``avail [n]``: drafts each sequence can verify."""
    n, max_k = rates.shape
    reach = rates.cumprod(axis=1)  # [n, max_k] P(drafts 1..j all accepted)
    if min(avail, default=max_k) < max_k:
        reach *= np.arange(max_k)[None, :] < np.asarray(avail)[:, None]
    tokens = np.empty((n, max_k + 1))  # [n, max_k + 1]
    tokens[:, 0] = 0.0
    reach.cumsum(axis=1, out=tokens[:, 1:])
    tokens += 1.0
    return tokens


def tokens_table(estimates: np.ndarray, max_k: int) -> np.ndarray:
    """``[n, max_k + 1, max_k + 1, max_k + 1]``: ``T[i, b, a, w]``, :func:`sequence_tokens` of
    sequence ``i`` at width ``w`` when ``a`` drafts are available and the proposer backs the
    first ``b`` of them (``b <= a``; the rest read the pooled unbacked rate, as
    ``AcceptanceModel.rates``). ``estimates [n, max_k + 2]``: the acceptance estimates."""
    k = max_k
    pos = np.arange(k)  # [max_k]
    counts = np.arange(k + 1)  # [max_k + 1]
    unbacked = pos[None, :] >= counts[:, None]  # [max_k + 1 (b), max_k]
    rates = np.where(unbacked[None], estimates[:, None, k:k + 1],
                     estimates[:, None, :k])  # [n, max_k + 1 (b), max_k]
    reach = rates.cumprod(axis=2)[:, :, None, :] * (pos[None, :] < counts[:, None])
    # reach [n, max_k + 1 (b), max_k + 1 (a), max_k]: P(drafts 1..j all accepted), 0 past
    # the a available
    table = np.empty(reach.shape[:3] + (k + 1,))  # [n, max_k + 1, max_k + 1, max_k + 1]
    table[..., 0] = 0.0
    reach.cumsum(axis=3, out=table[..., 1:])
    table += 1.0
    return table


def expected_by_width(rates: np.ndarray, avail: np.ndarray | list[int]) -> np.ndarray:
    """``[max_k + 1]``: ``E[w] = sum_i E_i[w]`` (:func:`sequence_tokens`), the step's expected
    tokens."""
    return sequence_tokens(rates, avail).sum(axis=0)


def typical_tokens(per_sequence: np.ndarray) -> np.ndarray:
    """``[max_k + 1]``: for each width, the expected tokens that at least half of the step's
    sequences reach (the upper median of ``per_sequence [n, max_k + 1]`` over sequences)."""
    n = per_sequence.shape[0]
    return np.partition(per_sequence, n // 2, axis=0)[n // 2]


def best_width(tokens: Sequence[float], cost: Sequence[float], min_width: int = 0,
               typical: Sequence[float] | None = None) -> int:
    """The ``w`` in ``min_width..max_k`` of largest ``tokens[w] / cost[w]`` (ties: the
    smaller); a ``w > 0`` must beat ``w = 0`` by ``MARGIN``. ``typical``
    (:func:`typical_tokens`): a width that would slow down the typical sequence
    (``typical[w] < cost[w]``: half the sequences gain less than the step costs) is not taken
    unless ``min_width`` asks for it. ``tokens``, ``cost``, ``typical``: ``[max_k + 1]``
    sequences (lists or arrays)."""
    screen = typical is not None and min_width == 0
    goodput = [0.0 if screen and typical[w] < cost[w] else tokens[w] / cost[w]
               for w in range(len(cost))]  # [max_k + 1]
    best = max(range(min_width, len(cost)), key=goodput.__getitem__)  # (ties: the first)
    if min_width == 0 and best > 0 and goodput[best] <= goodput[0] * (1.0 + MARGIN):
        return 0
    return best


def monotone_fit(values: Sequence[float], weights: Sequence[float]) -> list[float]:
    """The non-decreasing sequence nearest to ``values`` in weighted least squares (pool
    adjacent violators: a value below the one before it is averaged with it, by weight)."""
    blocks: list[list[float]] = []  # [value, weight, how many values]
    for value, weight in zip(values, weights, strict=True):
        blocks.append([value, weight, 1])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            v2, w2, n2 = blocks.pop()
            v1, w1, n1 = blocks.pop()
            blocks.append([(v1 * w1 + v2 * w2) / (w1 + w2), w1 + w2, n1 + n2])
    return [value for value, _, n in blocks for _ in range(int(n))]


def probe_wait(overhead: float, max_wait: int) -> int:
    """Steps between probes that cost ``overhead`` plain steps more than a plain step each:
    ``overhead / PROBE_BUDGET``, at least ``MIN_PROBE_WAIT`` and at most ``max_wait`` times the
    probe's cost in whole plain steps (a probe dearer than a plain step waits longer, but never
    without bound)."""
    wait = math.ceil(max(overhead, 0.0) / PROBE_BUDGET)
    return max(MIN_PROBE_WAIT, min(wait, max_wait * max(1, math.ceil(overhead))))


# The runner's packing rule (``ModelRunner.packed_rows``): (sequences, the most new tokens of one,
# new tokens in all) -> the rows of the packed step, or None when the step is padded.
PackedRows = Callable[[int, int, int], "int | None"]
# A step's layout less the steered sequences' drafts: (sequences, the most new tokens of one,
# new tokens in all); the drafts each steered sequence may verify are added per width.
Layout = tuple[int, int, int]


class GoodputController:
    """The decisions of one engine (see the module docstring). ``max_wait``: the longest wait
    between probes; ``verify_cost`` / ``draft_cost``: fixed relative costs instead of the
    measured ones (None: measured); ``packed_rows``: the runner's rule for packing a step of
    unequal rows (None: every step is padded to its longest sequence)."""

    def __init__(self, max_k: int, drafts_are_free: bool, max_wait: int,
                 verify_cost: float | None = None, draft_cost: float | None = None,
                 batch_bucket: Callable[[int], int] = int,
                 packed_rows: PackedRows | None = None) -> None:
        self.max_k = max_k
        self.packed_rows = packed_rows
        self.free = drafts_are_free
        self.max_wait = max_wait
        self.verify_cost = verify_cost
        self.draft_cost = draft_cost
        self.costs = StepCostTable(batch_bucket)
        self.acceptance = AcceptanceModel(max_k)
        self.clock = 0  # steps planned
        self.idle = 0  # steps since the last one that drafted
        self.probing = False  # this step is a probe
        self._idle_key: tuple | None = None  # what the last no-drafts answer was given for
        self._probe_overhead = 0.0  # a probe's cost over a plain step, at that answer
        self._fresh = False  # that answer weighed mostly untested sequences (probe sooner)
        self._recheck = False  # drafting stopped since the last probe (probe sooner once)
        self._keep_asking = False  # the last free proposal paid with its own cost counted
        self.drafting = False  # the last decision drafted (a probe does not count)
        self.settled = False  # the last plan weighed drafting and chose none (not a probe)
        self._step_costs: dict[int, tuple[int, np.ndarray, list[float]]] = {}  # batch size
        # -> (cost table version, step_cost, the same as a list)
        self._proposal_costs: tuple[int, int, float] | None = None  # (version, batch size,
        # propose_cost of a free proposer's max_k drafts)
        self._last_accs: list[RequestAcceptance] = []  # the sequences the last decision weighed
        self._last_choice: tuple | None = None  # choose_width's last (accs, avail, backed,
        # min_width, batch size)
        self._decided: tuple | None = None  # prepare()'s: (_choice_key, _decide's answer)
        self._table: tuple | None = None  # prepare()'s: (rows, acceptance version, spread,
        # tokens_table [n, max_k + 1, max_k + 1, max_k + 1], arange(n))

    # ---- costs --------------------------------------------------------------------------------
    def step_cost(self, batch_size: int) -> np.ndarray:
        """``[max_k + 2]``: ``C[w]``, a step verifying ``w - 1`` drafts (index ``w`` = tokens per
        sequence; index 0 unused) over a plain step. Read only (kept until the table changes)."""
        return self._step_cost(batch_size)[1]

    def _step_cost(self, batch_size: int) -> tuple[int, np.ndarray, list[float]]:
        version = self.costs.version
        cached = self._step_costs.get(batch_size)
        if cached is None or cached[0] != version:
            cost = self._measured_step_cost(batch_size)
            cached = self._step_costs[batch_size] = (version, cost, cost.tolist())
        return cached

    def _measured_step_cost(self, batch_size: int) -> np.ndarray:
        cost = np.empty(self.max_k + 2)
        cost[0] = cost[1] = 1.0
        if self.verify_cost is not None:
            cost[2:] = 1.0 + self.verify_cost * np.arange(1, self.max_k + 1)
            return cost
        # [max_k + 2]: each width's cost over the plain step's, None where not measured
        measured = [self.costs.relative("step", batch_size, w) for w in range(self.max_k + 2)]
        measured[1] = 1.0
        # The trusted costs, made non-decreasing by pooling (a step's work grows with its
        # width, so a cost below a narrower width's is noise). Pooled, not raised to the
        # narrower one: where widths cost about the same, raising each width to the largest
        # noise below it makes every wider width dearer than it is (docs/design.md, "Measured
        # reasons behind the runner's choices", ``monotone_fit``).
        counts = {w: self.costs.count("step", batch_size, w) for w in range(2, self.max_k + 2)
                  if measured[w] is not None}
        trusted = [w for w, n in counts.items() if n >= TRUSTED]
        if trusted:
            fitted = monotone_fit([max(measured[w], 1.0) for w in trusted],
                                  [counts[w] for w in trusted])
            for w, value in zip(trusted, fitted, strict=True):
                measured[w] = value
        # (the widths a width not measured is read between: an untrusted one's sample may be
        # a slow stretch's, which on a line through it made every narrower width dear)
        known = [1, *trusted]
        for w in range(2, self.max_k + 2):
            # A step costs at least what a narrower one does (its work is a superset): a cost
            # below it is noise, which would make drafts that are never accepted look free
            # (where a one-draft step costs about a plain step's).
            cost[w] = max(self._width_cost(w, measured, counts, known, cost), cost[w - 1])
        return cost

    @staticmethod
    def _width_cost(w: int, measured: list[float | None], counts: dict[int, int],
                    known: list[int], cost: np.ndarray) -> float:
        """Width ``w``'s cost before the floor of the narrower widths' (``cost[:w]`` final);
        ``counts``: the samples of each measured width (2 and wider)."""
        if measured[w] is not None:
            if counts[w] < TRUSTED:
                # (until the width holds TRUSTED samples it costs what the narrower one
                # does: one slow first step must not rule it out; it is tried)
                return cost[w - 1]
            return measured[w]
        # Not measured: between two measured widths, on the line through them (a step's cost
        # grows about linearly with its tokens); past the widest, the widest's cost, and with
        # nothing measured, DEFAULT_VERIFY_COST a token. Optimistic, so that the width is
        # tried and then judged on its own cost (a width priced at the default between two
        # measured ones can be the best and never be tried: docs/design.md, "Measured
        # reasons behind the runner's choices").
        lo = max(v for v in known if v < w)
        hi = min((v for v in known if v > w), default=None)
        if hi is not None:
            top = max(measured[hi], cost[lo])
            return cost[lo] + (top - cost[lo]) * (w - lo) / (hi - lo)
        if lo > 1:
            return cost[lo]
        return 1.0 + DEFAULT_VERIFY_COST * (w - 1)

    def packed_cost(self, batch_size: int, rows: int) -> float:
        """A packed step of ``rows`` rows (one new token each) over a plain step of
        ``batch_size`` sequences: measured (kind ``"packed"``, keyed by the rows' batch bucket)
        once trusted, else ``DEFAULT_VERIFY_COST`` for each row past the plain step's,
        relative to its rows (optimistic, so that packing is tried and then judged on its own
        cost, as a width is)."""
        bucket = self.costs.batch_bucket(rows)
        if self.verify_cost is None and self.costs.count("packed", batch_size, bucket) >= TRUSTED:
            cell = self.costs.seconds("packed", batch_size, bucket)
            plain_s = self.costs.seconds("step", batch_size, 1)
            if cell is not None and plain_s:
                return max(cell / plain_s, 1.0)
        per_row = DEFAULT_VERIFY_COST if self.verify_cost is None else self.verify_cost
        plain_rows = self.costs.batch_bucket(batch_size)
        return 1.0 + per_row * max(bucket - plain_rows, 0) / plain_rows

    def _with_packing(self, cost: list[float], b: int, layout: Layout | None,
                      drafts: Sequence[int], share: float = 1.0) -> list[float]:
        """``cost [max_k + 1]`` (index ``w``: at most ``w`` drafts a sequence), the widths
        whose step the runner packs (``packed_rows``) at the packed step's cost instead.
        ``layout``: the step less its steered sequences' drafts; ``drafts``: the most each
        steered sequence may verify; ``share``: the expected share of them verified (a free
        proposer's: the drafts it finds), given that the step verifies any."""
        if self.packed_rows is None or layout is None or not drafts:
            return cost
        n, longest, total = layout
        if self.packed_rows(n, max(longest, 2), total + 1) is None:
            return cost  # (a step of one more row is the easiest to pack: then none is)
        most = max(drafts)
        out = cost
        for w in range(1, self.max_k + 1):
            extra = sum(min(w, d) for d in drafts) if w < most else sum(drafts)
            rows = self.packed_rows(n, max(longest, 1 + min(w, most)),
                                    total + math.ceil(extra * share))
            if rows is not None:
                if out is cost:
                    out = list(cost)
                out[w] = self.packed_cost(b, rows)
        return out

    def _free_proposal_cost(self, batch_size: int) -> float:
        """:meth:`propose_cost` of a free proposer's ``max_k`` drafts (kept until the costs
        change)."""
        cached = self._proposal_costs
        if cached is None or cached[:2] != (self.costs.version, batch_size):
            cached = self._proposal_costs = (self.costs.version, batch_size,
                                             self.propose_cost(batch_size, self.max_k, 0.0))
        return cached[2]

    def propose_cost(self, batch_size: int, k: int, measured_draft_cost: float) -> float:
        """A proposal of ``k`` drafts over a plain step (0 for ``k = 0``)."""
        if k == 0:
            return 0.0
        if self.draft_cost is not None:
            return self.draft_cost * k
        measured = self.costs.relative("propose", batch_size, k)
        if measured is not None:
            return measured
        return 0.0 if self.free else measured_draft_cost * k

    def wants_plain_step(self, batch_size: int) -> bool:
        """Costs at this batch size are measured against its plain steps: while it lacks them
        but has drafting steps, every ``PLAIN_EVERY``-th step is plain."""
        if self.verify_cost is not None or self.clock % PLAIN_EVERY:
            return False
        if self.costs.count("step", batch_size, 1) >= MIN_PLAIN_SAMPLES:
            return False
        return any(self.costs.count("step", batch_size, w) >= MIN_PLAIN_SAMPLES
                   for w in range(2, self.max_k + 2))

    # ---- decisions ----------------------------------------------------------------------------
    def plan(self, accs: list[RequestAcceptance], caps: list[int], min_width: int,
             measured_draft_cost: float = 0.0, critical: list[bool] | None = None,
             batch_size: int | None = None, layout: Layout | None = None) -> int:
        """Before proposing: the drafts to ask for (0: none). ``accs``/``caps``: the running
        sequences whose drafts the controller chooses, and the most each may verify;
        ``min_width``: drafts some sequence verifies anyway (the least width to pick);
        ``critical``: which of ``accs`` count (None: all; a closed batch counts only the
        sequences with the most tokens left, ``scheduler.spec_policy``); ``batch_size``: the
        step's sequences, whose cost it is (None: ``len(accs)``); ``layout``: the step less
        the drafts of ``accs`` (:data:`Layout`; None: not packed). For a free proposer the answer
        is 0 or ``max_k`` (each sequence then asks for its cap and :meth:`choose_width` decides
        after)."""
        self._new_step()
        b = len(accs) if batch_size is None else batch_size
        all_caps = caps
        if critical is not None:
            accs, caps = list(compress(accs, critical)), list(compress(caps, critical))
        if not accs or max(caps, default=0) == 0:
            return 0
        if min_width == 0 and self.wants_plain_step(b):
            return 0
        if self._keep_asking:  # the last proposal paid, its cost counted: ask again
            self._keep_asking = False
            return self.max_k
        # Nothing was drafted and nothing learnt since the last step of these sequences: the
        # answer is still no drafts (save the host work; costs are looked at again each probe).
        key = (tuple(map(_row, accs)), tuple(caps), min_width, self.acceptance.version, layout)
        if self._idle_key == key:
            return self._idle_or_probe(self._probe_overhead)
        self._last_accs = accs
        estimates = self.acceptance.optimistic(accs, self._spread(len(accs)))  # [n, max_k + 2]
        rates = self.acceptance.rates(accs, estimates=estimates)  # [n, max_k]
        widened = 1.0  # the chance that the step verifies drafts at all
        if self.free:  # a sequence gains only when the proposer finds drafts it backs
            found = estimates[:, self.max_k + 1]  # [n]
            rates[:, 0] *= found  # (rates is a fresh array)
            widened = 1.0 - float(np.prod(1.0 - found))
        per_sequence = sequence_tokens(rates, caps)  # [n, max_k + 1]
        # (a free proposer's drafts come for the sequences it finds a match for: the expected
        # share of them, given that the step verifies any, prices a packed step)
        share = (float(found.mean()) / widened if self.free and widened > 0 else 1.0)
        step = self._with_packing(self._step_cost(b)[2][1:], b, layout, all_caps,
                                  min(share, 1.0))  # [max_k + 1]
        cost = np.ones(self.max_k + 1)
        free_proposal = self.propose_cost(b, self.max_k, 0.0) if self.free else 0.0
        for w in range(1, self.max_k + 1):
            proposal = free_proposal if self.free else self.propose_cost(b, w,
                                                                         measured_draft_cost)
            cost[w] = 1.0 + widened * (step[w] - 1.0) + proposal
        w = best_width(per_sequence.sum(axis=0), cost, min_width, typical_tokens(per_sequence))
        self._set_drafting(w > 0)
        if w > 0:
            self.idle, self._idle_key, self._recheck = 0, None, False
            return self.max_k if self.free else w
        self._idle_key = key
        self._probe_overhead = self._probe_cost(b, cost, measured_draft_cost) - 1.0
        self._fresh = self.acceptance.untested_share(accs) >= FRESH_SHARE
        return self._idle_or_probe(self._probe_overhead)

    def _probe_cost(self, b: int, cost: np.ndarray, measured_draft_cost: float) -> float:
        """A probe's cost in plain steps: its width's (``cost [max_k + 1]``, :meth:`plan`'s,
        whose proposal is a typical one), with the proposal's time after plain steps instead
        where measured (kind ``"probe"``: it catches up on the steps since the last one, and
        a probe's is never a typical proposal, so without it a probe reads as cheap as its
        forward and comes far too often: docs/design.md, "Measured reasons behind the
        runner's choices")."""
        w = self.max_k if self.free else 1
        after_idle = self.costs.relative("probe", b, w)
        if after_idle is None:
            return float(cost[w])
        typical = self.propose_cost(b, w, 0.0 if self.free else measured_draft_cost)
        return float(cost[w]) + max(after_idle - typical, 0.0)

    def _set_drafting(self, drafting: bool) -> None:
        """Record whether the decision drafts; a stop of drafting makes the next probe come
        sooner (``_recheck``, once: see the module docstring)."""
        self._recheck = self._recheck or (self.drafting and not drafting)
        self.drafting = drafting

    def plan_idle(self) -> int:
        """:meth:`plan` for a step of the same sequences as the last one, which drafted none,
        with nothing learnt since (the caller knows): none, or a probe when its wait is over."""
        self._new_step()
        return self._idle_or_probe(self._probe_overhead)

    def plan_again(self, batch_size: int, width: int) -> int:
        """:meth:`plan` for the same sequences as the last decision, which drafted ``width``
        (its answer), with nothing learnt since (the caller knows): the same, unless the batch
        size's plain step is due to be measured (:meth:`wants_plain_step`)."""
        self._new_step()
        return 0 if self.wants_plain_step(batch_size) else width

    def _new_step(self) -> None:
        self.clock += 1
        self.acceptance.tick()
        self.probing = self.settled = False

    def _idle_or_probe(self, overhead: float) -> int:
        """A step where drafting does not pay: none, or a probe when its wait is over."""
        self.idle += 1
        wait = probe_wait(overhead, self.max_wait)
        if self._fresh or self._recheck:  # (new text, or a stop that may be noise: see the
            wait = max(MIN_PROBE_WAIT, wait // FRESH_WAIT_DIVISOR)  # module docstring)
        if self.idle < wait:
            self.settled = True
            return 0
        self.idle, self.probing, self._idle_key, self._recheck = 0, True, None, False
        return self.max_k if self.free else 1

    def choose_width(self, accs: list[RequestAcceptance], avail: list[int],
                     backed: list[int] | None, min_width: int,
                     critical: list[bool] | None = None, batch_size: int | None = None,
                     layout: Layout | None = None, record: bool = True) -> int:
        """After a free proposer answered: how many drafts the step verifies at most.
        ``avail[i]``: the drafts sequence ``i`` got (within its cap); ``backed``: how many of
        them the proposer's evidence backs (None: all); ``critical``, ``batch_size``,
        ``layout``: as :meth:`plan`'s (every sequence learns from the proposal; the critical
        ones decide). ``record``: the proposal is recorded for the next update (False: the
        caller records it with the step's update, ``GoodputPolicy.learn``)."""
        # (found: drafts the proposer stands by; guesses past its evidence do not count)
        if record:
            self.acceptance.record_proposals(accs, avail if backed is None else backed)
        b = len(accs) if batch_size is None else batch_size
        # (every steered sequence verifies its drafts up to the width: all of them lay out
        # the step)
        packing = None if layout is None or self.packed_rows is None else (layout,
                                                                          tuple(avail))
        if critical is not None:
            accs, avail = list(compress(accs, critical)), list(compress(avail, critical))
            if backed is not None:
                backed = list(compress(backed, critical))
        if not accs:  # (no sequence it steers counts this step: nothing drafted for them)
            self._keep_asking = self.drafting = False
            return min_width
        self._last_accs = accs
        self._last_choice = (accs, avail, backed, min_width, b, packing)
        key = self._choice_key(accs, avail, backed, min_width, b, packing)
        decided = self._decided
        if decided is not None and decided[0] == key:
            w, self._keep_asking = decided[1]  # (prepared, or the same inputs' last answer)
        else:
            answer = self._decide(accs, avail, backed, min_width, b, packing)
            self._decided = (key, answer)  # (kept: steps learnt together ask it again)
            w, self._keep_asking = answer
        self._set_drafting(w > 0 and not self.probing)
        if self.probing:
            w = max(w, max(avail) if backed is None else max(backed, default=0))
        return w

    def _choice_key(self, accs: list[RequestAcceptance], avail: list[int],
                    backed: list[int] | None, min_width: int, b: int,
                    packing: tuple | None = None) -> tuple:
        """Everything :meth:`_decide` reads: the sequences, their drafts, the step's layout,
        the estimates' and the costs' versions, and the confidence spread."""
        return (tuple(map(_row, accs)), tuple(avail), None if backed is None else tuple(backed),
                min_width, b, packing, self.acceptance.version, self.costs.version,
                self._spread(len(accs)))

    def _decide(self, accs: list[RequestAcceptance], avail: list[int],
                backed: list[int] | None, min_width: int, b: int,
                packing: tuple | None = None) -> tuple[int, bool]:
        """:meth:`choose_width`'s width before a probe widens it, and whether the next step
        asks the proposer again without weighing it first. ``packing``: (the step's
        :data:`Layout`, every steered sequence's drafts), None where nothing is packed."""
        per_sequence = self._prepared_tokens(accs, avail, backed)  # [n, max_k + 1] or None
        if per_sequence is None:
            rates = self.acceptance.rates(accs, backed, self.acceptance.optimistic(
                accs, self._spread(len(accs))))  # [n, max_k]
            per_sequence = sequence_tokens(rates, avail)  # [n, max_k + 1]
        # (lists from here: a few plain Python operations on max_k + 1 values cost less host
        # time than numpy calls, and this runs between the proposal and the forward)
        tokens = per_sequence.sum(axis=0).tolist()  # [max_k + 1]
        typical = typical_tokens(per_sequence).tolist()  # [max_k + 1]
        cost = self._step_cost(b)[2][1:]  # [max_k + 1]: the proposal is paid already
        if packing is not None:
            cost = self._with_packing(cost, b, *packing)
        w = best_width(tokens, cost, min_width, typical)
        # Would this step have paid with the proposal's cost too? Then the next step asks the
        # proposer again without weighing it first (text that pays goes on paying; a step whose
        # drafts stop paying chooses 0 here, and the next one plans in full).
        proposal = self._free_proposal_cost(b)
        keep_asking = w > 0 and (tokens[w] / (cost[w] + proposal) > tokens[0] * (1.0 + MARGIN)
                                 and typical[w] >= cost[w] + proposal)
        return w, keep_asking

    def prepare(self, batch_size: int) -> None:
        """Ready the next decision, before it is asked for: the last decision's sequences
        (those still live) estimated with what was learnt since, their expected tokens for
        every (backed, available) drafts and width (:meth:`choose_width` then looks them up),
        the step costs at ``batch_size``, and a free proposer's width itself for the
        sequences and drafts of the last :meth:`choose_width` (while drafting). The next
        decision reuses them where its inputs are the same."""
        accs = [acc for acc in self._last_accs if acc.row >= 0]
        if accs:
            spread = self._spread(len(accs))
            estimates = self.acceptance.optimistic(accs, spread)  # [n, max_k + 2]
            key = (tuple(map(_row, accs)), self.acceptance.version, spread)
            # (only choose_width, a free proposer's, reads the table; one made for the same
            # sequences, estimates and spread is still right)
            if self.free and (self._table is None or self._table[:3] != key):
                self._table = (*key, tokens_table(estimates, self.max_k), np.arange(len(accs)))
        if batch_size:
            self.step_cost(batch_size)
        # The decision itself, for the drafts the last one had (in steady decoding every
        # sequence gets its cap again): choose_width then only compares its inputs, and the
        # host work between the proposal and the forward, which delays the forward, shrinks
        # (docs/history.md, "The speculation controller").
        self._decided = None
        choice = self._last_choice
        # (the sequences of that choice, all still live; plan() may have weighed others since)
        # (none while the controller is settled on plain steps: only a probe asks next)
        if (self.free and not self.settled and choice is not None
                and all(acc.row >= 0 for acc in choice[0])):
            self._decided = (self._choice_key(*choice), self._decide(*choice))

    def _prepared_tokens(self, accs: list[RequestAcceptance], avail: list[int],
                         backed: list[int] | None) -> np.ndarray | None:
        """``[n, max_k + 1]``: :func:`sequence_tokens` of ``accs`` for these drafts, looked up
        in the table :meth:`prepare` made, or None when it was made for other sequences,
        other estimates or another spread."""
        table = self._table
        if (table is None or table[1] != self.acceptance.version
                or table[2] != self._spread(len(accs)) or table[0] != tuple(map(_row, accs))):
            return None
        n = len(accs)
        got = np.fromiter(avail, dtype=np.int64, count=n)  # [n]
        # [n] or a scalar: the backed drafts' count, the table's second index
        sure = self.max_k if backed is None else np.fromiter(backed, dtype=np.int64, count=n)
        return table[3][table[4], sure, got]

    def _spread(self, batch_size: int) -> float:
        """Standard errors added to the first draft's acceptance: while drafting, enough that
        noise does not stop it (:func:`confidence_spread`); none to start drafting again."""
        return confidence_spread(batch_size) if self.drafting else 0.0

    def record(self, batch_size: int, width: int, step_s: float, num_asked: int,
               propose_s: float | None, after_idle_s: float | None = None,
               packed_rows: int | None = None, kv: int = 0) -> None:
        """A steady decode step: ``width`` tokens per sequence, ``step_s`` seconds without the
        proposal, which took ``propose_s`` for ``num_asked`` drafts asked per sequence (None:
        not a typical one), or ``after_idle_s`` when it was the first after steps without one
        (a probe's: what a probe's proposal costs, kind ``"probe"``); ``packed_rows``: the
        runner packed the step into that many rows (kind ``"packed"``, by their bucket);
        ``kv``: the step's context (``StepCostTable.record``)."""
        if packed_rows is None:
            self.costs.record("step", batch_size, width, step_s, kv)
        else:
            self.costs.record("packed", batch_size, self.costs.batch_bucket(packed_rows),
                              step_s, kv)
        if num_asked and propose_s is not None:
            self.costs.record("propose", batch_size, num_asked, propose_s)
        if num_asked and after_idle_s is not None:
            self.costs.record("probe", batch_size, num_asked, after_idle_s)
