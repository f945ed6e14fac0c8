"""A plain flight's one-pass commit (:mod:`engine.plain_commit`) does to every sequence what the
general rules do with one token (``append_until_stop``, the accounting, the cached length):
compared on random batches of every kind of stop, failed and aborted rows."""

from __future__ import annotations

import random

from engine.plain_commit import FAILED_ROW, commit_plain
from engine.sequence import Sequence
from engine.stop_checker import append_until_stop
from samplers.sampling_params import SamplingParams
from scheduler import SequenceStatus
from tests.engine.llm_helpers import EOS_ID, tiny_tokenizer

TOK = tiny_tokenizer(32)
EOS = frozenset({EOS_ID, 9})  # (two EOS ids, as a generation config may give)
MAX_MODEL_LEN = 24


def random_params(rng: random.Random) -> SamplingParams:
    max_tokens = rng.choice([None, 1, 2, 5, 9])
    stop = rng.choice([None, None, None, ["w6"], ["w5 w6", "w7"]])
    return SamplingParams(
        max_tokens=max_tokens,
        min_tokens=rng.choice([0, 0, 1, 3]) if max_tokens is None or max_tokens >= 3 else 0,
        ignore_eos=rng.random() < 0.3,
        include_stop_str_in_output=rng.random() < 0.5,
        stop=stop, stop_token_ids=rng.choice([None, None, None, [6], [EOS_ID, 8]]),
        detokenize=stop is not None or rng.random() < 0.8)


def state(seq: Sequence) -> tuple:
    m = seq.metrics
    return (seq.output_token_ids, seq.all_token_ids, seq.text, seq.status, seq.finish_reason,
            seq.stop_reason, seq.error, seq.num_computed_tokens, m.num_steps, m.num_generated,
            m.first_token_time, m.finished_time)


def general_rules(seq: Sequence, token: int, failed: bool, now: float) -> int:
    """What the general commit (``LLMEngine._commit`` and ``_rollback``) does to a sequence of
    a plain flight: the tokens it keeps."""
    before = seq.num_tokens
    kept = 0
    if failed:
        seq.finish("error", error=FAILED_ROW)
    else:
        kept = append_until_stop(seq, [token], EOS, MAX_MODEL_LEN)
        m = seq.metrics
        m.num_steps += 1
        m.num_generated += kept
        if m.first_token_time is None:
            m.first_token_time = now
        if seq.is_finished:
            m.finished_time = now
    seq.num_computed_tokens = before if seq.is_finished else seq.num_tokens - 1
    return kept


def test_one_pass_commit_equals_the_general_rules():
    finished_seen = set()
    for seed in range(6):
        finished_seen |= compare_on_random_batches(seed)
    # every way a token ends a sample was met
    assert {("stop", "NoneType"), ("stop", "int"), ("stop", "str"), ("length", "NoneType"),
            ("error", "NoneType"), ("abort", "NoneType")} <= finished_seen


def compare_on_random_batches(seed: int) -> set[tuple[str, str]]:
    """Flights of random rows over 40 random sequences, each committed in one pass and by the
    general rules on a twin; returns the (finish reason, stop reason's type) pairs met."""
    rng = random.Random(seed)
    pairs = []
    for i in range(40):
        params = random_params(rng)
        prompt = [rng.randrange(3, 32) for _ in range(rng.randrange(1, 6))]
        a, b = (Sequence(f"r{i}", 0, None, prompt, params, TOK, EOS, 0.0) for _ in range(2))
        for seq in (a, b):
            seq.status, seq.slot = SequenceStatus.RUNNING, i
        pairs.append((a, b))
    for step in range(14):
        live = [j for j, (a, _) in enumerate(pairs) if not a.is_finished]
        if not live:
            break
        rows = rng.sample(live, min(len(live), rng.randrange(1, 12)))
        if rng.random() < 0.3:  # (a sequence aborted while in flight gets nothing)
            j = rng.choice(rows)
            for seq in pairs[j]:
                seq.finish("abort")
        # tokens: EOS ids, stop ids and words often; now and then a row marked invalid (-2)
        tokens = [rng.choice([EOS_ID, 9, 6, 5, 7, 8, -2] + list(range(3, 32)))
                  for _ in rows]
        failed = {k for k in range(len(rows)) if rng.random() < 0.05}
        # (index -> the next flight's width for the sequences it holds)
        ahead_of = {j: rng.choice([0, 0, 3]) for j in rows if rng.random() < 0.6}
        now = float(step + 1)
        done = commit_plain([pairs[j][0] for j in rows], tokens, failed, EOS, MAX_MODEL_LEN,
                            now, {id(pairs[j][0]): w for j, w in ahead_of.items()})
        expected_updated, expected_kept, expected_truncations = [], 0, []
        for k, j in enumerate(rows):
            seq = pairs[j][1]
            if seq.is_finished:
                continue
            expected_updated.append(j)
            expected_kept += general_rules(seq, tokens[k], k in failed or tokens[k] < 0, now)
            if not seq.is_finished and ahead_of.get(j, 0):
                expected_truncations.append((seq.slot, seq.num_tokens - 1 + ahead_of[j]))
            elif not seq.is_finished and j not in ahead_of:
                expected_truncations.append((seq.slot, seq.num_computed_tokens))
        index = {id(a): j for j, (a, _) in enumerate(pairs)}
        assert [index[id(s)] for s in done.updated] == expected_updated
        assert done.num_kept == expected_kept
        assert done.truncations == expected_truncations
        assert [index[id(s)] for s in done.finished] == [
            j for j in expected_updated if pairs[j][1].is_finished]
        for j in rows:
            assert state(pairs[j][0]) == state(pairs[j][1]), (step, j)
    return {(a.finish_reason, type(a.stop_reason).__name__) for a, _ in pairs if a.is_finished}
