"""Scheduler: admission, token budget, chunked prefill, preemption order, removal."""

import pytest

from engine.sequence import Sequence
from samplers import SamplingParams
from scheduler import Scheduler, SequenceStatus


def make(rid: str, prompt_len: int) -> Sequence:
    return Sequence(rid, 0, None, list(range(3, 3 + prompt_len)), SamplingParams(), None,
                    frozenset(), 0.0)


def decode_ready(req: Sequence, num_output: int = 1) -> None:
    """Pretend the prompt was prefilled and ``num_output`` tokens sampled."""
    for _ in range(num_output):
        req.append_token(5)
    req.num_computed_tokens = req.num_tokens - 1


def test_admits_up_to_max_num_seqs_in_arrival_order():
    sched = Scheduler(max_num_seqs=2, max_num_batched_tokens=100)
    reqs = [make(str(i), 4) for i in range(3)]
    for r in reqs:
        sched.add(r)
    out = sched.schedule(lambda r: 0)
    assert [s.seq for s in out.scheduled] == reqs[:2]
    assert out.admitted == reqs[:2]
    assert all(s.num_context_tokens == 4 and s.samples for s in out.scheduled)
    assert [r.status for r in reqs] == [SequenceStatus.RUNNING] * 2 + [SequenceStatus.WAITING]
    assert list(sched.waiting) == [reqs[2]]


def test_long_prompt_is_chunked_while_others_decode():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=8)
    running = make("a", 3)
    sched.add(running)
    sched.schedule(lambda r: 0)
    decode_ready(running)
    long = make("b", 20)
    sched.add(long)
    out = sched.schedule(lambda r: 2)
    # the decoding request brings its newest token + 2 drafts; the long prompt gets the rest
    assert [(s.seq.request_id, s.num_context_tokens, s.num_spec_tokens, s.samples)
            for s in out.scheduled] == [("a", 1, 2, True), ("b", 5, 0, False)]
    assert out.num_tokens == 8
    long.num_computed_tokens += 5
    out = sched.schedule(lambda r: 2)
    assert [(s.seq.request_id, s.num_context_tokens) for s in out.scheduled] == [
        ("a", 1), ("b", 5)]
    long.num_computed_tokens = 17
    out = sched.schedule(lambda r: 2)
    # the last chunk (3 tokens) samples and may carry drafts within the budget: 8 - 3 - 3 = 2
    assert [(s.seq.request_id, s.num_context_tokens, s.num_spec_tokens, s.samples)
            for s in out.scheduled] == [("a", 1, 2, True), ("b", 3, 2, True)]


def test_drafts_are_cut_to_the_budget():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=5)
    a, b = make("a", 2), make("b", 2)
    for r in (a, b):
        sched.add(r)
    sched.schedule(lambda r: 0)
    decode_ready(a)
    decode_ready(b)
    out = sched.schedule(lambda r: 4)
    assert [(s.num_context_tokens, s.num_spec_tokens) for s in out.scheduled] == [(1, 3), (1, 0)]


def test_free_kv_tokens_gates_admission():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100)
    a, b = make("a", 6), make("b", 6)
    sched.add(a)
    sched.add(b)
    out = sched.schedule(lambda r: 0, free_kv_tokens=10)
    assert out.admitted == [a]
    assert list(sched.waiting) == [b]


def test_admission_leaves_room_for_the_running_tokens_of_the_step():
    """Found in review: admission compared a newcomer's chunk with the whole free KV, so near a
    full cache it admitted one that the step's forward could not hold (KVCacheFull, and the
    newcomer preempted before it ever ran)."""
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100)
    a, b = make("a", 2), make("b", 3)
    sched.add(a)
    sched.schedule(lambda r: 0)
    decode_ready(a)
    sched.add(b)
    # a brings its newest token and 4 drafts: 5 of the 7 free rows; b's 3 do not fit beside it
    out = sched.schedule(lambda r: 4, free_kv_tokens=7)
    assert [(s.seq, s.num_tokens) for s in out.scheduled] == [(a, 5)]
    assert out.admitted == [] and list(sched.waiting) == [b]
    out = sched.schedule(lambda r: 4, free_kv_tokens=8)  # now 5 + 3 fit
    assert out.admitted == [b]


def test_preempt_takes_the_most_recent_back_to_the_front():
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100)
    reqs = [make(str(i), 3) for i in range(4)]
    for r in reqs[:3]:
        sched.add(r)
    sched.schedule(lambda r: 0)
    sched.add(reqs[3])
    decode_ready(reqs[2], num_output=2)
    victim = sched.preempt()
    assert victim is reqs[2]
    assert victim.status == SequenceStatus.WAITING
    assert victim.num_computed_tokens == 0 and victim.slot is None
    assert victim.metrics.num_preemptions == 1
    assert victim.output_token_ids == [5, 5]  # kept: recomputed as context later
    assert list(sched.waiting) == [reqs[2], reqs[3]]
    out = sched.schedule(lambda r: 0)
    # readmitted first, prefilling prompt + output so far
    assert out.admitted == [reqs[2], reqs[3]]
    assert out.scheduled[2].num_context_tokens == 5


def test_finish_removes_at_once_and_frees_a_place():
    sched = Scheduler(max_num_seqs=1, max_num_batched_tokens=100)
    a, b = make("a", 2), make("b", 2)
    sched.add(a)
    sched.add(b)
    assert sched.schedule(lambda r: 0).admitted == [a]
    sched.finish(a)
    assert sched.running == []
    assert sched.schedule(lambda r: 0).admitted == [b]
    sched.finish(b)
    assert not sched.has_unfinished
    assert sched.preempt() is None


@pytest.mark.parametrize("kwargs", [dict(max_num_seqs=0, max_num_batched_tokens=4),
                                    dict(max_num_seqs=1, max_num_batched_tokens=0)])
def test_bad_limits_raise(kwargs):
    with pytest.raises(ValueError, match="max_num"):
        Scheduler(**kwargs)


def test_a_cached_prefix_shortens_a_newcomers_chunk_and_admission_counts_its_locked_rows():
    """Prompts of 10 tokens, 8 cached; the hook says 6 of those 8 rows would be taken from the
    free space. With 9 free rows the first fits (2 new + 6 taken = 8), the second does not (1
    row left, 8 needed); the first's chunk is the 2 tokens after the prefix, and it samples
    with 3 drafts."""
    sched = Scheduler(max_num_seqs=4, max_num_batched_tokens=100)
    a, b = make("a", 10), make("b", 10)
    sched.add(a)
    sched.add(b)
    out = sched.schedule(lambda r: 3, free_kv_tokens=9, cached_prefix=lambda seq: (8, 6))
    assert out.admitted == [a]
    (item,) = out.scheduled
    assert (item.num_context_tokens, item.num_cached_tokens, item.samples,
            item.num_spec_tokens) == (2, 8, True, 3)
