"""SpeculationPolicy.kept_drafts: how many drafts of each sequence a step verifies."""

from engine.config import SpeculativeConfig
from engine.sequence import Sequence
from proposers import Proposal
from samplers import SamplingParams
from scheduler import ScheduledSequence, SpeculationPolicy


def item(name, k, params=None):
    seq = Sequence(name, 0, None, [1, 2, 3], params or SamplingParams(temperature=0), None,
                   frozenset(), 0.0)
    return ScheduledSequence(seq, 1, True, k)


def policy(adaptive=True):
    spec = SpeculativeConfig(method="ngram", num_speculative_tokens=4, adaptive_k=adaptive)
    return SpeculationPolicy(spec, 4, 512, drafts_are_free=True, measured_draft_cost=lambda: 0.0)


def kept(policy: SpeculationPolicy, items: list[ScheduledSequence], proposal: Proposal):
    return policy.kept_drafts(items, proposal.draft_token_ids, proposal.num_backed)


def test_the_step_verifies_up_to_its_longest_backed_run():
    items = [item("a", 4), item("b", 4), item("c", 2)]
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8], [9, 9]], None, [1, 3, 2])
    # b backs 3 drafts: every sequence verifies up to 3 (free in the padded forward), c its 2
    assert kept(policy(), items, proposal) == [3, 3, 2]
    weak = Proposal([[1, 2, 3, 4], [5], []], None, [1, 1, 0])
    assert kept(policy(), items, weak) == [1, 1, 1]
    assert kept(policy(), items, Proposal([[], [], []], None, [0, 0, 0])) == [0, 0, 0]


def test_without_backing_or_adaptive_k_every_scheduled_draft_is_verified():
    items = [item("a", 4), item("b", 3)]
    assert kept(policy(), items, Proposal([[1, 2, 3, 4], [5, 6, 7]], None)) == [4, 3]
    backed = Proposal([[1, 2, 3, 4], [5, 6, 7]], None, [1, 0])
    assert kept(policy(adaptive=False), items, backed) == [4, 3]


def test_a_seeded_sample_keeps_its_k_and_sets_the_width():
    seeded = SamplingParams(temperature=0.8, seed=3)
    items = [item("seeded", 4, seeded), item("greedy", 4)]
    proposal = Proposal([[1, 2, 3, 4], [5, 6, 7, 8]], None, [1, 1])
    assert kept(policy(), items, proposal) == [4, 4]
    short = Proposal([[1, 2], [5, 6, 7, 8]], None, [1, 1])
    assert kept(policy(), items, short) == [4, 2]


def test_a_step_with_nothing_running_leaves_the_probing_clock_alone():
    """Found on the CPU benchmark: the first step of every batch (only admissions) chose k from
    the engine's recent acceptance and a one-sequence cost, and reset the probe backoff."""
    drafts = policy()
    drafts.adaptive.batch.backoff = 8
    drafts.begin_step([])
    assert drafts.adaptive.batch.backoff == 8
    assert drafts.num_spec_tokens(item("a", 0).seq) == 0
