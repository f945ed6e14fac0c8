"""SpeculationPolicy: caps, per-request control, seeded samples and the drafts a step verifies."""

import pytest

from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from proposers import Proposal
from samplers import SamplingParams
from scheduler import ScheduledSequence, SpeculationPolicy

GREEDY = SamplingParams(temperature=0, max_tokens=100)


def policy(adaptive=True, free=True):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4, adaptive_k=adaptive)
    return SpeculationPolicy(spec, 4, 512, drafts_are_free=free, measured_draft_cost=lambda: 0.0)


def item(policy, name, k, params=GREEDY):
    seq = Sequence(name, 0, None, [1, 2, 3], params, None, frozenset(), 0.0)
    seq.speculation = policy.new_tracker(seq)
    return ScheduledSequence(seq, 1, True, k)


def kept(policy, items, proposal, free_kv=None):
    return policy.kept_drafts(items, proposal.draft_token_ids, proposal.num_backed, free_kv)


def test_a_request_caps_or_turns_off_its_own_speculation():
    drafts = policy(adaptive=False)
    off = item(drafts, "off", 0, SamplingParams(temperature=0, num_speculative_tokens=0))
    two = item(drafts, "two", 0, SamplingParams(temperature=0, num_speculative_tokens=2))
    default = item(drafts, "default", 0)
    near_end = item(drafts, "end", 0, SamplingParams(temperature=0, max_tokens=3))
    drafts.begin_step([i.seq for i in (off, two, default, near_end)])
    assert [drafts.num_spec_tokens(i.seq) for i in (off, two, default, near_end)] == [0, 2, 4, 2]
    adaptive = policy()
    off.seq.speculation = adaptive.new_tracker(off.seq)
    adaptive.begin_step([off.seq])
    assert adaptive.num_spec_tokens(off.seq) == 0  # nothing to decide: no drafts, no probes


def test_a_free_proposers_drafts_are_verified_up_to_the_chosen_width():
    drafts = policy()
    items = [item(drafts, n, 4) for n in "abc"]
    for _ in range(30):  # two backed drafts pass, guesses after them fail
        drafts.update([i.seq for i in items], [4] * 3, [2] * 3, [2] * 3)
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8], [9]], None, [2, 2, 1])
    assert kept(drafts, items, proposal) == [2, 2, 1]
    assert kept(policy(adaptive=False), items, proposal) == [4, 4, 1]


def test_a_seeded_sample_is_steered_like_any_other():
    """Its tokens do not depend on its drafts (keyed sampling), so it gets no fixed k: where its
    drafts fail the controller stops drafting for it too."""
    drafts = policy()
    seeded = item(drafts, "seeded", 4, SamplingParams(temperature=0.8, seed=3))
    greedy = item(drafts, "greedy", 4)
    for _ in range(30):  # both sequences' drafts all fail
        drafts.update([greedy.seq, seeded.seq], [4, 4], [0, 0], [4, 4])
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8]], None, [4, 4])
    assert kept(drafts, [seeded, greedy], proposal) == [0, 0]
    for _ in range(60):  # now every draft passes
        drafts.update([greedy.seq, seeded.seq], [4, 4], [4, 4], [4, 4])
    assert kept(drafts, [seeded, greedy], proposal) == [4, 4]


def test_drafts_past_the_kv_caches_spare_rows_are_cut():
    drafts = policy(adaptive=False)
    items = [item(drafts, n, 4) for n in "ab"]
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8]], None)
    assert kept(drafts, items, proposal, free_kv=7) == [4, 1]  # 2 rows for the context
    assert kept(drafts, items, proposal, free_kv=2) == [0, 0]


def decoding(policy, name, num_output, params=GREEDY, together=True):
    """A running sequence of a 3-token prompt that has ``num_output`` tokens already."""
    seq = Sequence(name, 0, None, [1, 2, 3], params, None, frozenset(), 0.0)
    for _ in range(num_output):
        seq.append_token(7, with_text=False)
    seq.num_computed_tokens = seq.num_tokens - 1  # (its newest token is fed next step)
    seq.speculation = policy.new_tracker(seq, together)
    return seq


def critical_after_begin(policy, seqs, waiting=False):
    policy.begin_step(seqs, waiting)
    return [s.speculation.critical for s in seqs]


def test_a_closed_batch_marks_the_sequences_with_the_most_tokens_left():
    """``max_tokens=100``: 90, 87 and 86 tokens left for the first three (within k = 4 of the
    most), 60 for the last: it is ahead and does not count, until something waits to be
    admitted, a request has no max_tokens, or the caller does not wait for the whole batch."""
    drafts = policy()
    seqs = [decoding(drafts, n, out) for n, out in zip("abcd", (10, 13, 14, 40), strict=True)]
    assert critical_after_begin(drafts, seqs) == [True, True, True, False]
    assert critical_after_begin(drafts, seqs, waiting=True) == [True] * 4
    unbounded = decoding(drafts, "e", 0, SamplingParams(temperature=0, max_tokens=None))
    assert critical_after_begin(drafts, seqs + [unbounded]) == [True] * 5
    streamed = decoding(drafts, "f", 0, together=False)
    assert critical_after_begin(drafts, seqs + [streamed]) == [True] * 5
    # a seeded sample with the most tokens left makes every steered sequence ahead of it
    seeded = decoding(drafts, "g", 0, SamplingParams(temperature=0.8, seed=1, max_tokens=100))
    assert critical_after_begin(drafts, seqs + [seeded]) == [False] * 4 + [True]
    # a sequence still in its prefill (it cannot draft yet) is left out, whatever it has left
    prefilling = decoding(drafts, "h", 0)
    prefilling.num_computed_tokens = 0
    assert critical_after_begin(drafts, seqs + [prefilling]) == [True, True, True, False, False]


def test_steps_that_draft_nothing_still_probe_within_the_bound_and_an_opt_out_never_does():
    """Drafts that were all rejected: the same sequences step after step draft nothing (the
    policy does not weigh them again while nothing changes) except a probe at least every
    ``adaptive_probe_interval`` steps; a request that opts out is never asked for drafts."""
    drafts = policy()
    seqs = [decoding(drafts, n, 0) for n in "abc"]
    items = [ScheduledSequence(s, 1, True, 4) for s in seqs]
    for _ in range(30):
        drafts.update(seqs, [4] * 3, [0] * 3, [4] * 3)
    asked, plans = [], [0]
    full_plan = drafts.controller.plan

    def counted_plan(*args, **kwargs):
        plans[0] += 1
        return full_plan(*args, **kwargs)

    drafts.controller.plan = counted_plan
    for _ in range(64):
        drafts.begin_step(seqs)
        asked.append([drafts.num_spec_tokens(s) for s in seqs])
        if asked[-1][0]:  # a probe: its drafts are rejected again
            kept(drafts, items, Proposal([[1, 2, 3, 4]] * 3, None, [4] * 3))
            drafts.update(seqs, [4] * 3, [0] * 3, [4] * 3)
    probes = [i for i, a in enumerate(asked) if a[0]]
    # weighed in full only after a probe (what it learnt changes the answer's inputs); the
    # other steps reuse the answer
    assert plans[0] <= len(probes) + 1 < 64
    assert all(a in ([0] * 3, [4] * 3) for a in asked)
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    bound = drafts.controller.max_wait  # (adaptive_probe_interval: 32 by default)
    assert bound == 32
    assert probes and probes[0] < bound and all(gap <= bound for gap in gaps)
    assert len(probes) < 16  # mostly plain steps
    before = plans[0]
    drafts.begin_step(seqs[:2])  # a sequence left: weighed again
    assert plans[0] == before + 1
    off = decoding(drafts, "off", 0, SamplingParams(temperature=0, max_tokens=100,
                                                    num_speculative_tokens=0))
    for _ in range(64):
        drafts.begin_step([off])
        assert drafts.num_spec_tokens(off) == 0


def test_deferred_updates_wait_for_flush_and_so_do_the_rows_they_name():
    """A GPU engine defers each step's learning to the next forward's shadow: the acceptance
    does not change until ``flush``, a sequence that leaves meanwhile keeps its row (no new
    request may take it) until the updates naming it are learnt, and the learnt counts are
    those of updating at once."""
    now, later = policy(), policy()
    later.defer_updates = True
    pairs = [(item(now, n, 4), item(later, n, 4)) for n in "ab"]
    for p in (now, later):
        for _ in range(3):  # (the same three steps on both policies)
            p.controller.acceptance.tick()
            p.update([s for s in (pairs[0][p is later].seq, pairs[1][p is later].seq)],
                     [4, 4], [2, 0], [4, 4])
    before = later.controller.acceptance.counts.copy()
    assert not before.any()  # nothing learnt yet
    gone = pairs[0][1].seq
    row = gone.speculation.row
    later.release(gone)
    assert gone.speculation.row == row  # kept while an update names it
    newcomer = item(later, "c", 4)
    assert newcomer.seq.speculation.row != row
    later.flush()
    assert gone.speculation.row == -1
    acc_now, acc_later = now.controller.acceptance, later.controller.acceptance
    for (a, b) in pairs:
        b_row = b.seq.speculation.row if b.seq is not gone else row
        assert (acc_later.counts[b_row] == acc_now.counts[a.seq.speculation.row]).all()
    # (the engine's counts differ only in how long its optimistic start aged, its first
    # update coming a step later: its rates, which new requests start from, agree; the
    # requests' own counts are the same)
    assert acc_later.engine_rates == pytest.approx(acc_now.engine_rates, abs=0.02)
    assert acc_later.counts[row].any()  # (the row is free but was counted before it left)
    later.release(pairs[1][1].seq)  # nothing pending: freed at once
    assert pairs[1][1].seq.speculation.row == -1
    with pytest.raises(ValueError, match="released"):  # said at once, not at the flush
        later.update([pairs[1][1].seq], [4], [1], [4])
    # turning deferral off learns what was held back: nothing stays queued
    later.update([newcomer.seq], [4], [4], [4])
    later.defer_updates = False
    assert acc_later.counts[newcomer.seq.speculation.row].any()
    later.release(newcomer.seq)
    assert newcomer.seq.speculation.row == -1


def test_the_controller_prices_the_steps_whole_layout():
    """The layout a free proposer's width is priced with counts every sequence of the step:
    the steered ones and the sequences that asked for none (``others``: opted out, or in a
    prefill chunk)."""
    drafts = policy()
    seen = []
    choose = drafts.controller.choose_width
    drafts.controller.choose_width = lambda *args: (seen.append(args), choose(*args))[1]
    items = [item(drafts, n, 4) for n in "abc"]
    proposal = Proposal([[1, 2], [3, 4, 5, 6], [7]], None, [2, 4, 1])
    drafts.kept_drafts(items, proposal.draft_token_ids, proposal.num_backed, None,
                       (5, 7, 11))  # (4 decodes and a 7-token prompt chunk)
    batch_size, layout = seen[-1][5:7]
    # 8 sequences; the most new tokens: the chunk's 7; before the drafts: the 3 items' one
    # token each and the others' 11 tokens
    assert batch_size == 8 and layout == (8, 7, 3 + 11)
