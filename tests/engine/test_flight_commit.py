"""A flight's one-pass commit (:mod:`engine.flight_commit`) does to every sequence what the general
rules do (``append_until_stop``, the accounting and metrics, the cached length, the proposer's
``on_accepted``): compared on random plain and drafting flights with every kind of stop, failed,
invalid and aborted rows."""

from __future__ import annotations

import random

from engine.flight_commit import FAILED_ROW, commit_chains, commit_plain
from engine.metrics import MetricsCollector
from engine.sequence import Sequence
from engine.stop_checker import append_until_stop
from samplers import INVALID_TOKEN_ID, PLACEHOLDER_TOKEN_ID
from samplers.sampling_params import SamplingParams
from scheduler import SequenceStatus
from tests.engine.llm_helpers import EOS_ID, tiny_tokenizer

TOK = tiny_tokenizer(32)
EOS = frozenset({EOS_ID, 9})  # (two EOS ids, as a generation config may give)
MAX_MODEL_LEN = 24
MAX_K = 3


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
            seq.stop_reason, seq.error, seq.num_computed_tokens, m.num_drafted, m.num_accepted,
            m.num_steps, m.num_generated, m.first_token_time, m.finished_time)


def general_rules(seq: Sequence, row: list[int], k: int, failed: bool, now: float,
                  metrics: MetricsCollector, width: int | None, truncations: list,
                  accepted_calls: list) -> int:
    """What the general commit (``LLMEngine._commit``, ``_account`` and ``_rollback``) does to a
    sequence of a flight (``k`` drafts; 0: plain) with its row of tokens; ``width``: the next
    flight's for a sequence it holds (None: not held). Returns the tokens kept."""
    tokens = [t for t in row if t != PLACEHOLDER_TOKEN_ID]
    before, accepted, kept = seq.num_tokens, len(tokens) - 1, 0
    if failed or tokens[0] == INVALID_TOKEN_ID:
        seq.finish("error", error=FAILED_ROW)
    else:
        kept = append_until_stop(seq, tokens, EOS, MAX_MODEL_LEN)
        m = seq.metrics
        m.num_drafted += k
        m.num_accepted += accepted
        m.num_steps += 1
        m.num_generated += kept
        if m.first_token_time is None:
            m.first_token_time = now
        if seq.is_finished:
            m.finished_time = now
        metrics.record_request_step(k, accepted, kept)
    if seq.is_finished:
        seq.num_computed_tokens = before + min(accepted, kept)
        return kept
    seq.num_computed_tokens = seq.num_tokens - 1
    if width is None:
        truncations.append((seq.slot, seq.num_computed_tokens))
        if k:
            accepted_calls.append((seq.seq_id, before + min(accepted, kept)))
    elif width:
        truncations.append((seq.slot, seq.num_tokens - 1 + width))
    return kept


def random_row(rng: random.Random, k: int) -> list[int]:
    """A flight row: ``k + 1`` tokens, the accepted drafts and one more, then placeholders;
    now and then a row the kernels marked invalid."""
    if rng.random() < 0.05:
        return [INVALID_TOKEN_ID] * (k + 1)
    accepted = rng.randrange(k + 1)
    words = [EOS_ID, 9, 6, 5, 7, 8] + list(range(3, 32))
    return ([rng.choice(words) for _ in range(accepted + 1)]
            + [PLACEHOLDER_TOKEN_ID] * (k - accepted))


def test_one_pass_commit_equals_the_general_rules():
    finished_seen = set()
    for seed in range(8):
        finished_seen |= compare_on_random_flights(seed)
    # every way a token ends a sample was met
    assert {("stop", "NoneType"), ("stop", "int"), ("stop", "str"), ("length", "NoneType"),
            ("error", "NoneType"), ("abort", "NoneType")} <= finished_seen


def compare_on_random_flights(seed: int) -> set[tuple[str, str]]:
    """Plain and drafting flights of random rows over 40 random sequences, each committed in
    one pass and by the general rules on a twin; returns the (finish reason, stop reason's
    type) pairs met."""
    rng = random.Random(seed)
    pairs = []
    for i in range(40):
        params = random_params(rng)
        prompt = [rng.randrange(3, 32) for _ in range(rng.randrange(1, 6))]
        a, b = (Sequence(f"r{i}", 0, None, prompt, params, TOK, EOS, 0.0) for _ in range(2))
        for seq in (a, b):
            seq.status, seq.slot = SequenceStatus.RUNNING, i
        pairs.append((a, b))
    metrics = [MetricsCollector(MAX_K), MetricsCollector(MAX_K)]
    for step in range(14):
        live = [j for j, (a, _) in enumerate(pairs) if not a.is_finished]
        if not live:
            break
        rows = rng.sample(live, min(len(live), rng.randrange(1, 12)))
        if rng.random() < 0.3:  # (a sequence aborted while in flight gets nothing)
            j = rng.choice(rows)
            for seq in pairs[j]:
                seq.finish("abort")
        k = rng.choice([0, 0, 1, MAX_K])
        tokens = [random_row(rng, k) for _ in rows]
        failed = {r for r in range(len(rows)) if rng.random() < 0.05}
        # (index -> the next flight's width for the sequences it holds)
        ahead_of = {j: rng.choice([0, 0, 3]) for j in rows if rng.random() < 0.6}
        ahead = {id(pairs[j][0]): w for j, w in ahead_of.items()}
        now = float(step + 1)
        calls = []
        if k == 0:
            done = commit_plain([pairs[j][0] for j in rows], [t[0] for t in tokens], failed,
                                EOS, MAX_MODEL_LEN, now, ahead, metrics[0],
                                lambda seq, r, kept, calls=calls: calls.append(
                                    (seq.seq_id, r, kept, seq.num_output_tokens)))
        else:
            done = commit_chains([pairs[j][0] for j in rows], tokens, k, failed, EOS,
                                 MAX_MODEL_LEN, now, ahead, metrics[0],
                                 lambda seq_id, n, calls=calls: calls.append((seq_id, n)))
        expected_updated, expected_kept, truncations, expected_calls = [], 0, [], []
        for r, j in enumerate(rows):
            seq = pairs[j][1]
            if seq.is_finished:
                continue
            expected_updated.append(j)
            expected_kept += general_rules(seq, tokens[r], k, r in failed, now, metrics[1],
                                           ahead_of.get(j), truncations, expected_calls)
        index = {id(a): j for j, (a, _) in enumerate(pairs)}
        assert [index[id(s)] for s in done.updated] == expected_updated
        assert done.num_kept == expected_kept
        assert done.truncations == truncations
        if k == 0:  # (each kept token handed over, after its append: row, token, count)
            assert calls == [(pairs[j][0].seq_id, r, [tokens[r][0]],
                              pairs[j][1].num_output_tokens)
                             for r, j in enumerate(rows) if j in expected_updated
                             and tokens[r][0] != INVALID_TOKEN_ID and r not in failed]
        else:
            assert calls == expected_calls
        assert [index[id(s)] for s in done.finished] == [
            j for j in expected_updated if pairs[j][1].is_finished]
        for j in rows:
            assert state(pairs[j][0]) == state(pairs[j][1]), (step, j)
        assert vars(metrics[0]) == vars(metrics[1])
        if k:  # (the verified rows and their accepted drafts: what the controller learns)
            assert done.verified == [
                (r, sum(t != PLACEHOLDER_TOKEN_ID for t in tokens[r]) - 1)
                for r, j in enumerate(rows) if j in expected_updated
                and tokens[r][0] != INVALID_TOKEN_ID and r not in failed]
    return {(a.finish_reason, type(a.stop_reason).__name__) for a, _ in pairs if a.is_finished}
