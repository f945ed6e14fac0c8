"""The tree gate on synthetic yield streams: per batch size, a step drafts trees only where tree
steps realised more tokens per second than chain steps; the arms alternate until both hold
evidence, the loser then runs only as a rare probe, and a change of text is followed."""

from scheduler.tree_gate import MIN_EVIDENCE, PROBE_INTERVAL, TreeGate

STEP_S = 0.010  # a chain step's seconds in these streams


def feed(gate, steps, batch_size, tree_tokens, tree_seconds, chain_tokens, chain_seconds):
    """``steps`` steps planned (``allows``), each recorded with its arm's yield and cost."""
    chosen = []
    for _ in range(steps):
        use = gate.allows(batch_size)
        chosen.append(use)
        if use:
            gate.record(batch_size, True, tree_tokens, tree_seconds)
        else:
            gate.record(batch_size, False, chain_tokens, chain_seconds)
    return chosen


def test_trees_that_pay_are_kept_and_chains_only_probed():
    gate = TreeGate()
    # trees: 3.0 tokens in 1.2 steps' time (2.5 per step) against chains' 1.9 per step
    chosen = feed(gate, 320, 1, 3, 1.2 * STEP_S, 1.9, STEP_S)
    settled = chosen[2 * int(MIN_EVIDENCE) + 2:]
    assert chosen[0]  # (a tree configuration starts with trees)
    assert chosen.count(False) >= MIN_EVIDENCE  # (chains were measured)
    assert settled.count(False) <= len(settled) // PROBE_INTERVAL + 1


def test_trees_that_lose_give_way_to_chains():
    gate = TreeGate()
    # trees: 2.2 tokens in 1.4 steps' time (1.57 per step) against chains' 1.9 per step
    chosen = feed(gate, 320, 1, 2.2, 1.4 * STEP_S, 1.9, STEP_S)
    settled = chosen[2 * int(MIN_EVIDENCE) + 2:]
    assert settled.count(True) <= len(settled) // PROBE_INTERVAL + 1
    assert gate.chain_steps > gate.tree_steps


def test_each_batch_size_is_judged_on_its_own():
    gate = TreeGate()
    feed(gate, 200, 1, 3, 1.2 * STEP_S, 1.9, STEP_S)  # batch 1: trees pay
    feed(gate, 200, 2, 2.2, 1.4 * STEP_S, 1.9, STEP_S)  # batch 2: they lose
    assert sum(gate.allows(1) for _ in range(PROBE_INTERVAL - 1)) >= PROBE_INTERVAL - 2
    assert sum(gate.allows(2) for _ in range(PROBE_INTERVAL - 1)) <= 1


def test_a_change_of_text_is_followed():
    gate = TreeGate()
    feed(gate, 200, 1, 3, 1.2 * STEP_S, 1.9, STEP_S)  # trees pay ...
    chosen = feed(gate, 300, 1, 1.3, 1.4 * STEP_S, 1.9, STEP_S)  # ... then they do not
    assert chosen[-64:].count(True) <= 64 // PROBE_INTERVAL + 1
    # and back again: the probes of the trees see them pay
    chosen = feed(gate, 600, 1, 3, 1.2 * STEP_S, 1.9, STEP_S)
    assert chosen[-64:].count(False) <= 64 // PROBE_INTERVAL + 1


def test_a_loser_that_gets_better_is_seen_within_a_few_probes():
    gate = TreeGate()
    feed(gate, 400, 1, 2.2, 1.4 * STEP_S, 1.9, STEP_S)  # trees lose for a long while ...
    chosen = feed(gate, 5 * PROBE_INTERVAL, 1, 3, 1.2 * STEP_S, 1.9, STEP_S)  # ... then pay
    # (each probe of the trees weighs as much as a chain step of its time: two or three do)
    assert chosen[-PROBE_INTERVAL:].count(True) >= PROBE_INTERVAL - 2


def test_steps_without_a_cost_teach_nothing():
    gate = TreeGate()
    gate.record(1, True, 3, 0.0)
    assert gate.buckets.get(1) is None or gate.buckets[1].tree.steps == 0


def test_the_policy_learns_only_from_steps_that_asked_the_gate():
    """A step whose sequences could draft no tree (the engine did not ask the gate) measures
    other requests: it is not chain evidence."""
    from engine.config import SpeculativeConfig
    from scheduler import StepOutcome, StepTiming, make_controller

    spec = SpeculativeConfig(method="eagle", num_speculative_tokens=3, draft_tree=[2])
    policy = make_controller(spec, 3, 64, drafts_are_free=False,
                             measured_draft_cost=lambda: 0.5)
    gate = policy.trees
    timing = StepTiming(1, 4, STEP_S, 3, None, None, None, 16, 0.0)

    def step(ask: bool, tree: bool) -> None:
        plan = policy.plan([])
        if ask:
            policy.allows_tree(1)
        policy.learn(StepOutcome(seqs=[_Seq()], drafted=[3], accepted=[2], backed=[None],
                                 private=[tree], timing=timing, step=plan.step))

    step(ask=False, tree=False)
    assert 1 not in gate.buckets or gate.buckets[1].chain.steps == 0
    step(ask=True, tree=True)
    assert gate.buckets[1].tree.steps == 1 and gate.buckets[1].chain.steps == 0


class _Seq:
    """A sequence the controller has released (acceptance row -1): only timing is learnt."""

    class speculation:  # noqa: N801
        row = -1
