"""N-gram prompt lookup: the rule on hand-built contexts, then against a brute-force reference."""

import random

import numpy as np
import pytest

from engine.config import SpeculativeConfig
from proposers import ProposeRequest, get_proposer
from proposers.ngram import NgramProposer
from proposers.ngram_table import MAX_VALUE, NgramTable
from samplers import SamplingParams

GREEDY = SamplingParams(temperature=0)


def propose_one(proposer, tokens, k, req_id=0):
    proposal = proposer.propose([ProposeRequest(req_id, list(tokens), k, GREEDY)])
    assert proposal.draft_probs is None
    return proposal.draft_token_ids[0]


def brute_force(tokens, k, lo, hi):
    """The documented rule, written the slow obvious way."""
    length = len(tokens)
    for n in range(hi, lo - 1, -1):
        if n >= length:
            continue
        suffix = tokens[length - n:]
        for end in range(length - 2, n - 2, -1):  # most recent occurrence with a follower
            if tokens[end - n + 1:end + 1] == suffix:
                drafts = list(tokens)
                for j in range(k):  # an overlapping copy: it may read drafts copied before
                    drafts.append(drafts[end + 1 + j])
                return drafts[length:]
    return []


def matched_length(tokens, lo, hi):
    """The n of the documented rule's winning match (0: none), the slow obvious way."""
    length = len(tokens)
    for n in range(min(hi, length - 1), lo - 1, -1):
        suffix = tokens[length - n:]
        if any(tokens[end - n + 1:end + 1] == suffix for end in range(length - 2, n - 2, -1)):
            return n
    return 0


def test_docstring_example():
    tokens = [5, 7, 9, 2, 7, 9, 4, 7, 9]
    assert propose_one(NgramProposer(1, 3), tokens, 2) == [4, 7]
    # k larger than what follows: the period-3 repetition goes on
    assert propose_one(NgramProposer(1, 3), tokens, 5) == [4, 7, 9, 4, 7]


def test_a_match_backs_as_many_drafts_as_it_has_tokens():
    proposer = NgramProposer(1, 3)
    requests = [ProposeRequest("two", [5, 7, 9, 2, 7, 9, 4, 7, 9], 4, GREEDY),  # [7, 9] matched
                ProposeRequest("one", [1, 2, 3, 2], 4, GREEDY),  # [2] matched
                ProposeRequest("three", [1, 2, 3, 4, 1, 2, 3], 2, GREEDY),  # [1, 2, 3], k = 2
                ProposeRequest("none", [1, 2, 3], 4, GREEDY)]
    proposal = proposer.propose(requests)
    assert proposal.draft_token_ids == [[4, 7, 9, 4], [3, 2, 3, 2], [4, 1], []]
    assert proposal.num_backed == [2, 1, 2, 0]


def test_a_loop_is_continued():
    assert propose_one(NgramProposer(1, 4), [6, 2, 8, 8, 8, 8], 4) == [8, 8, 8, 8]
    assert propose_one(NgramProposer(2, 2), [1, 5, 3, 5, 3], 5) == [5, 3, 5, 3, 5]


def test_no_match():
    assert propose_one(NgramProposer(1, 4), [1, 2, 3, 4, 5], 3) == []
    assert propose_one(NgramProposer(1, 4), [7], 3) == []


def test_several_matches_most_recent_wins():
    # [8, 1] occurs at 0-1 (then 2) and at 3-4 (then 6); suffix is [8, 1].
    assert propose_one(NgramProposer(2, 2), [8, 1, 2, 8, 1, 6, 0, 8, 1], 1) == [6]


def test_longer_match_beats_more_recent_shorter_one():
    # suffix [4, 5]: the 2-gram occurs at 0-1 (then 9); 1-gram [5] occurs more recently at 3.
    tokens = [4, 5, 9, 5, 3, 4, 5]
    assert propose_one(NgramProposer(1, 2), tokens, 1) == [9]
    assert propose_one(NgramProposer(1, 1), tokens, 1) == [3]


def test_match_right_before_the_suffix():
    # [3, 3] at 0-1 is followed by the last 3 only: period 1, the 3s go on.
    assert propose_one(NgramProposer(1, 2), [3, 3, 3], 4) == [3, 3, 3, 3]
    # [1, 2, 1] at 2-4 is followed by [2] and the context ends: period 2.
    assert propose_one(NgramProposer(2, 3), [1, 2, 1, 2, 1, 2], 3) == [1, 2, 1]


def test_prompt_lookup_min_is_respected():
    assert propose_one(NgramProposer(2, 3), [6, 1, 2, 6], 2) == []
    assert propose_one(NgramProposer(1, 3), [6, 1, 2, 6], 2) == [1, 2]


def test_k_zero_drafts_nothing_but_indexes():
    proposer = NgramProposer(1, 2)
    assert propose_one(proposer, [1, 2, 3, 1], 0) == []
    assert propose_one(proposer, [1, 2, 3, 1, 2], 2) == [3, 1]


def test_observed_steps_leave_proposals_as_the_rule_says():
    """Steps without drafts shown to ``observe`` (the engine does it in a GPU forward's
    shadow), then a proposal: the drafts are the rule's, as if it had read it all at once."""
    rng = random.Random(3)
    observed, fresh = NgramProposer(1, 4), NgramProposer(1, 4)
    contexts = {i: [rng.randrange(5) for _ in range(20)] for i in range(4)}
    for step in range(40):
        for context in contexts.values():
            context.append(rng.randrange(5))
        if step % 7 == 6:
            requests = [ProposeRequest(i, list(c), 4, GREEDY) for i, c in contexts.items()]
            got = observed.propose(requests).draft_token_ids
            assert got == [brute_force(r.token_ids, 4, 1, 4) for r in requests], step
            assert got == fresh.propose(requests).draft_token_ids
        else:
            observed.observe([ProposeRequest(i, list(c), 0, GREEDY)
                              for i, c in contexts.items()])


def test_batch_of_different_k_and_requests():
    proposer = get_proposer("ngram", SpeculativeConfig(method="ngram", prompt_lookup_min=1,
                                                             prompt_lookup_max=3),
                            None)
    requests = [ProposeRequest("a", [1, 2, 3, 1, 2], 3, GREEDY),
                ProposeRequest("b", [4, 4], 0, GREEDY),
                ProposeRequest("c", [9, 8, 7, 9], 1, GREEDY)]
    assert proposer.propose(requests).draft_token_ids == [[3, 1, 2], [], [8]]


@pytest.mark.parametrize("lo,hi", [(1, 4), (2, 3), (3, 3)])
def test_incremental_growth_matches_brute_force(lo, hi):
    rng = random.Random(lo * 10 + hi)
    proposer = NgramProposer(lo, hi)
    contexts = {i: [rng.randrange(4) for _ in range(rng.randrange(1, 6))] for i in range(6)}
    for step in range(60):
        ids = rng.sample(sorted(contexts), rng.randrange(1, len(contexts) + 1))
        requests = [ProposeRequest(i, list(contexts[i]), rng.randrange(0, 6), GREEDY)
                    for i in ids]
        proposal = proposer.propose(requests)
        got = proposal.draft_token_ids
        want = [brute_force(r.token_ids, r.num_spec_tokens, lo, hi) for r in requests]
        assert got == want, step
        # a match of n tokens backs its first n drafts
        assert proposal.num_backed == [min(len(w), matched_length(r.token_ids, lo, hi))
                                       for w, r in zip(want, requests, strict=True)], step
        for i in ids:  # grow by 0..5 tokens, sometimes finish and restart a request
            if rng.random() < 0.05:
                proposer.remove(i)
                contexts[i] = [rng.randrange(4)]
            else:
                contexts[i].extend(rng.randrange(4) for _ in range(rng.randrange(6)))


def test_long_random_contexts_match_brute_force():
    """Bigger vocabulary and contexts, mixed id types and sequence types, k up to past the end."""
    rng = random.Random(7)
    proposer = NgramProposer(2, 5)
    contexts = {f"r{i}" if i % 2 else i: [rng.randrange(12) for _ in range(rng.randrange(1, 200))]
                for i in range(10)}
    for step in range(25):
        ids = rng.sample(sorted(contexts, key=str), rng.randrange(1, len(contexts) + 1))
        requests = [ProposeRequest(i, tuple(contexts[i]) if step % 3 == 0 else contexts[i],
                                   rng.randrange(0, 9), GREEDY) for i in ids]
        got = proposer.propose(requests).draft_token_ids
        want = [brute_force(list(r.token_ids), r.num_spec_tokens, 2, 5) for r in requests]
        assert got == want, step
        assert all(type(d) is list for d in got)
        for i in ids:  # copy a random earlier stretch (so long matches occur), or edit the end
            context = contexts[i]
            start = rng.randrange(len(context))
            context.extend(context[start:start + rng.randrange(1, 12)])
            if rng.random() < 0.1:
                context[-1] = (context[-1] + 1) % 12


def test_changed_context_is_reindexed():
    proposer = NgramProposer(1, 2)
    assert propose_one(proposer, [1, 2, 3, 1], 1) == [2]
    assert propose_one(proposer, [5, 6, 5], 1) == [6]  # same id, shorter and different context
    assert propose_one(proposer, [5, 6, 7, 6, 5, 6], 1) == [7]  # last indexed token changed


@pytest.mark.parametrize("kwargs", [{"prompt_lookup_min": 0}, {"prompt_lookup_max": 0},
                                    {"prompt_lookup_min": 3, "prompt_lookup_max": 2},
                                    {"prompt_lookup_min": 1.5}])
def test_bad_sizes(kwargs):
    with pytest.raises(ValueError, match="prompt_lookup_m"):
        NgramProposer(**kwargs)


def test_table_matches_dict_and_rebuilds():
    """Random odd 64-bit keys (as hashes are) against a dict keeping each key's largest value,
    rebuilding when the table says so; duplicates and lookups (value 0) in the batches."""
    rng = np.random.default_rng(0)
    table, reference = NgramTable(capacity=16, window=4), {}

    def update(table, keys, values):
        for key, value in zip(keys.tolist(), values.tolist(), strict=True):
            reference[key] = max(reference.get(key, 0), value)
        got = None if table.needs_room(len(keys)) else table.update(keys, values)
        if got is None:
            capacity = table.capacity * 2
            while capacity < 8 * len(reference):
                capacity *= 2
            table = NgramTable(capacity=capacity, window=4)
            known = np.array(list(reference), np.uint64)
            assert table.update(known, np.array(list(reference.values()))) is not None
            got = table.update(keys, values)
        assert got.tolist() == [reference[key] for key in keys.tolist()]
        return table

    for step in range(60):
        keys = rng.integers(0, 1 << 64, size=rng.integers(1, 30), dtype=np.uint64) | 1
        if step % 3:  # keys seen before, some of them twice in the batch
            keys[: len(keys) // 2] = rng.choice(np.array(list(reference) or [1], np.uint64),
                                                len(keys) // 2)
        values = rng.integers(0, MAX_VALUE + 1, size=len(keys))
        values[rng.random(len(keys)) < 0.2] = 0  # lookups
        table = update(table, keys, values)
        probe = np.concatenate([np.array(list(reference), np.uint64),
                                rng.integers(0, 1 << 64, size=3, dtype=np.uint64) | 1])
        table = update(table, probe, np.zeros(len(probe), np.int64))  # lookups only
    assert table.capacity > 16


def table_keys(capacity: int, home: int, tags: range) -> np.ndarray:
    """Keys whose home slot is ``home`` (their high bits) and whose tags are ``tags`` (odd)."""
    bits = capacity.bit_length() - 1
    return np.array([home << (64 - bits) | tag for tag in tags], np.uint64)


def test_table_keys_racing_for_one_slot_and_a_crowded_window():
    table = NgramTable(capacity=16, window=4)
    keys = table_keys(16, 3, range(1, 13, 2))  # six different tags, all with home slot 3
    # All four find slot 3 empty in round one: one keeps it, the others go again, to round two.
    assert table.update(keys[:4], np.arange(1, 5)).tolist() == [1, 2, 3, 4]
    assert table.update(keys[:4], np.zeros(1, np.int64)).tolist() == [1, 2, 3, 4]
    assert table.update(keys[:4], np.array([9, 0, 1, 5])).tolist() == [9, 2, 3, 5]  # the max
    assert table.update(keys[4:], np.arange(5, 7)) is None  # slots 3 .. 6 are taken
    assert NgramTable(capacity=16, window=1).update(keys[:2], np.arange(1, 3)) is None
    # A wider window: the last keys settle past round two's first slots, in round three.
    table = NgramTable(capacity=16, window=8)
    assert table.update(keys[:5], np.arange(1, 6)).tolist() == [1, 2, 3, 4, 5]
    assert table.update(keys[5:], np.array([6])).tolist() == [6]
    assert table.update(keys, np.zeros(1, np.int64)).tolist() == [1, 2, 3, 4, 5, 6]


def test_table_lookups_see_the_same_batch():
    """A lookup (value 0) in a batch gets the largest value stored for its key in that batch."""
    table = NgramTable(capacity=64, window=4)
    keys = table_keys(64, 7, range(1, 7, 2))
    assert table.update(keys[[0, 1, 0, 0, 2]], np.array([0, 4, 3, 0, 0])).tolist() == [
        3, 4, 3, 3, 0]
    assert table.update(keys, np.zeros(1, np.int64)).tolist() == [3, 4, 0]


def test_proposer_rebuilds_its_table_and_still_matches_brute_force():
    rng = random.Random(3)
    proposer = NgramProposer(1, 3, table_capacity=16)
    contexts = {i: [rng.randrange(5) for _ in range(rng.randrange(1, 40))] for i in range(8)}
    tables = [proposer._table]
    for step in range(40):
        requests = [ProposeRequest(i, list(c), rng.randrange(0, 5), GREEDY)
                    for i, c in contexts.items()]
        got = proposer.propose(requests).draft_token_ids
        assert got == [brute_force(r.token_ids, r.num_spec_tokens, 1, 3) for r in requests], step
        if proposer._table is not tables[-1]:
            tables.append(proposer._table)
        for i, context in contexts.items():
            if rng.random() < 0.1:
                proposer.remove(i)
                contexts[i] = [rng.randrange(5)]
            else:
                context.extend(rng.randrange(5) for _ in range(rng.randrange(1, 16)))
    assert len(tables) >= 3  # rebuilt at least twice, and grew after the first rebuild
    assert tables[-1].capacity > tables[1].capacity


def test_many_requests_joining_and_leaving_match_brute_force():
    """More requests than the first slots, the batch changing order and members between steps
    (and staying the same for a few), contexts growing past the copies' width."""
    rng = random.Random(11)
    proposer = NgramProposer(1, 4)
    contexts = {i: [rng.randrange(6) for _ in range(rng.randrange(1, 30))] for i in range(40)}
    ids = sorted(contexts)
    for step in range(30):
        if step % 4 == 0:  # a new batch: another order, some requests left out
            ids = rng.sample(sorted(contexts), rng.randrange(20, len(contexts) + 1))
        requests = [ProposeRequest(i, contexts[i], rng.randrange(0, 6), GREEDY) for i in ids]
        got = proposer.propose(requests).draft_token_ids
        want = [brute_force(r.token_ids, r.num_spec_tokens, 1, 4) for r in requests]
        assert got == want, step
        for i in ids:
            contexts[i].extend(rng.randrange(6) for _ in range(rng.randrange(0, 9)))
        if step % 7 == 6:  # one finishes, another arrives (as a new batch)
            proposer.remove(ids[0])
            del contexts[ids[0]]
            contexts[100 + step] = [rng.randrange(6) for _ in range(rng.randrange(1, 80))]
            ids = sorted(contexts)


def test_registry_and_request_checks():
    with pytest.raises(ValueError, match="method='medusa' is invalid: allowed draft_model"):
        get_proposer("medusa", SpeculativeConfig(method="ngram"), None)
    with pytest.raises(ValueError, match="num_spec_tokens=-1"):
        ProposeRequest(0, [1], -1, GREEDY)
    with pytest.raises(ValueError, match="token_ids"):
        ProposeRequest(0, [], 2, GREEDY)


@pytest.mark.parametrize("kwargs,field", [({"window": 0}, "window"),
                                          ({"capacity": 24}, "capacity"),
                                          ({"capacity": 4, "window": 8}, "capacity")])
def test_bad_table_sizes(kwargs, field):
    with pytest.raises(ValueError, match=f"{field}="):
        NgramTable(**kwargs)
