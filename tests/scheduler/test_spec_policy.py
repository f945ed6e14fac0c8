"""The speculation controllers (fixed k, goodput): caps, per-request control, seeded samples and
the drafts a step verifies, through the engine's three calls (plan, trim, learn)."""


from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from proposers import Proposal
from samplers import SamplingParams
from scheduler import ScheduledSequence, StepOutcome, make_controller, within_spare

GREEDY = SamplingParams(temperature=0, max_tokens=100)


def policy(adaptive=True, free=True):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4, adaptive_k=adaptive)
    return make_controller(spec, 4, 512, drafts_are_free=free, measured_draft_cost=lambda: 0.0)


def update(policy, seqs, drafted, accepted, backed):
    """The outcome of the policy's current step (what its trim recorded goes with it)."""
    policy.learn(StepOutcome(seqs, drafted, accepted, backed, step=getattr(policy, "_step", -1)))


def asked(policy, running, waiting=False):
    """The drafts each of ``running`` asks for this step."""
    plan = policy.plan(running, waiting)
    return [plan.drafts_for(seq) for seq in running]


def item(policy, name, k, params=GREEDY):
    seq = Sequence(name, 0, None, [1, 2, 3], params, None, frozenset(), 0.0)
    seq.speculation = policy.new_tracker(seq)
    return ScheduledSequence(seq, 1, True, k)


def kept(policy, items, proposal, free_kv=None):
    """What the engine verifies: the controller's trim, then the KV cache's spare rows."""
    got = policy.trim(items, [len(d) for d in proposal.draft_token_ids], proposal.num_backed,
                      (0, 0, 0))
    spare = None if free_kv is None else free_kv - sum(i.num_context_tokens for i in items)
    return within_spare(got, spare)


def test_a_request_caps_or_turns_off_its_own_speculation():
    drafts = policy(adaptive=False)
    off = item(drafts, "off", 0, SamplingParams(temperature=0, num_speculative_tokens=0))
    two = item(drafts, "two", 0, SamplingParams(temperature=0, num_speculative_tokens=2))
    default = item(drafts, "default", 0)
    near_end = item(drafts, "end", 0, SamplingParams(temperature=0, max_tokens=3))
    assert asked(drafts, [i.seq for i in (off, two, default, near_end)]) == [0, 2, 4, 2]
    adaptive = policy()
    off.seq.speculation = adaptive.new_tracker(off.seq)
    assert asked(adaptive, [off.seq]) == [0]  # nothing to decide: no drafts, no probes


def test_a_free_proposers_drafts_are_verified_up_to_the_chosen_width():
    drafts = policy()
    items = [item(drafts, n, 4) for n in "abc"]
    for _ in range(30):  # two backed drafts pass, guesses after them fail
        update(drafts, [i.seq for i in items], [4] * 3, [2] * 3, [2] * 3)
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8], [9]], None, [2, 2, 1])
    assert kept(drafts, items, proposal) == [2, 2, 1]
    assert kept(policy(adaptive=False), items, proposal) == [4, 4, 1]


def test_drafts_made_on_the_device_are_verified_up_to_the_width_trim_would_choose():
    """A drafting step whose drafts the proposer makes on the device has no proposal to trim:
    ``device_width`` chooses its width before the launch, as trim would with every draft
    backed; none once the drafts fail. A fixed k verifies every cap (the widest one), and a
    step with ``ahead`` tokens on the device sees its caps that much nearer the end."""
    drafts = policy()
    items = [item(drafts, n, 4) for n in "abc"]
    seqs = [i.seq for i in items]
    for _ in range(30):  # two drafts pass, those after them fail
        update(drafts, seqs, [4] * 3, [2] * 3, [4] * 3)
    plan = drafts.plan(seqs)
    assert [plan.drafts_for(seq) for seq in seqs] == [4] * 3  # (a free proposer: every cap)
    width = drafts.device_width(seqs, plan)
    assert width == 2
    proposal = Proposal([[1, 2, 3, 4]] * 3, None, [4] * 3)
    assert kept(drafts, items, proposal) == [width] * 3
    for _ in range(60):  # now every draft fails
        update(drafts, seqs, [4] * 3, [0] * 3, [4] * 3)
    assert drafts.device_width(seqs, drafts.plan(seqs)) == 0
    fixed = policy(adaptive=False)
    short = item(fixed, "short", 0, SamplingParams(temperature=0, max_tokens=3))  # (cap 2)
    default = item(fixed, "default", 0)
    plan = fixed.plan([short.seq, default.seq], False)
    assert fixed.device_width([short.seq, default.seq], plan) == 4
    assert fixed.device_width([short.seq], plan) == 2
    assert fixed.device_width([short.seq], plan, 1) == 1


def test_a_seeded_sample_is_steered_like_any_other():
    """Its tokens do not depend on its drafts (keyed sampling), so it gets no fixed k: where its
    drafts fail the controller stops drafting for it too."""
    drafts = policy()
    seeded = item(drafts, "seeded", 4, SamplingParams(temperature=0.8, seed=3))
    greedy = item(drafts, "greedy", 4)
    for _ in range(30):  # both sequences' drafts all fail
        update(drafts, [greedy.seq, seeded.seq], [4, 4], [0, 0], [4, 4])
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8]], None, [4, 4])
    assert kept(drafts, [seeded, greedy], proposal) == [0, 0]
    for _ in range(60):  # now every draft passes
        update(drafts, [greedy.seq, seeded.seq], [4, 4], [4, 4], [4, 4])
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
    policy.plan(seqs, waiting)
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
        update(drafts, seqs, [4] * 3, [0] * 3, [4] * 3)
    steps, plans = [], [0]
    full_plan = drafts.controller.plan

    def counted_plan(*args, **kwargs):
        plans[0] += 1
        return full_plan(*args, **kwargs)

    drafts.controller.plan = counted_plan
    for _ in range(64):
        steps.append(asked(drafts, seqs))
        if steps[-1][0]:  # a probe: its drafts are rejected again
            kept(drafts, items, Proposal([[1, 2, 3, 4]] * 3, None, [4] * 3))
            update(drafts, seqs, [4] * 3, [0] * 3, [4] * 3)
    probes = [i for i, a in enumerate(steps) if a[0]]
    # weighed in full only after a probe (what it learnt changes the answer's inputs); the
    # other steps reuse the answer
    assert plans[0] <= len(probes) + 1 < 64
    assert all(a in ([0] * 3, [4] * 3) for a in steps)
    gaps = [b - a for a, b in zip(probes, probes[1:], strict=False)]
    bound = drafts.controller.max_wait  # (adaptive_probe_interval: 32 by default)
    assert bound == 32
    assert probes and probes[0] < bound and all(gap <= bound for gap in gaps)
    assert len(probes) < 16  # mostly plain steps
    before = plans[0]
    drafts.plan(seqs[:2], False)  # a sequence left: weighed again
    assert plans[0] == before + 1
    off = decoding(drafts, "off", 0, SamplingParams(temperature=0, max_tokens=100,
                                                    num_speculative_tokens=0))
    for _ in range(64):
        assert asked(drafts, [off]) == [0]


def test_learning_releases_the_sequences_that_left_and_skips_those_aborted_since():
    """An outcome's finished sequences keep their rows until their drafts are learnt; a
    sequence released before the outcome is learnt (aborted meanwhile) is skipped."""
    drafts = policy()
    stays, leaves, aborted = (item(drafts, n, 4).seq for n in "abc")
    drafts.release(aborted)
    row = leaves.speculation.row
    drafts.learn(StepOutcome([stays, leaves, aborted], [4, 4, 4], [4, 0, 4], [4, 4, 4],
                             finished=[leaves]))
    acceptance = drafts.controller.acceptance
    assert leaves.speculation.row == -1 and aborted.speculation.row == -1
    assert acceptance.counts[row].any()  # (learnt before its row was freed)
    assert acceptance.counts[stays.speculation.row].any()


def test_the_controller_prices_the_steps_whole_layout():
    """The layout a free proposer's width is priced with counts every sequence of the step:
    the steered ones and the sequences that asked for none (``others``: opted out, or in a
    prefill chunk)."""
    drafts = policy()
    seen = []
    choose = drafts.controller.choose_width
    drafts.controller.choose_width = lambda *args, **kw: (seen.append(args), choose(*args, **kw))[1]
    items = [item(drafts, n, 4) for n in "abc"]
    proposal = Proposal([[1, 2], [3, 4, 5, 6], [7]], None, [2, 4, 1])
    drafts.trim(items, [len(d) for d in proposal.draft_token_ids], proposal.num_backed,
                (5, 7, 11))  # (4 decodes and a 7-token prompt chunk)
    batch_size, layout = seen[-1][5:7]
    # 8 sequences; the most new tokens: the chunk's 7; before the drafts: the 3 items' one
    # token each and the others' 11 tokens
    assert batch_size == 8 and layout == (8, 7, 3 + 11)
