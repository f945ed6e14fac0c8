"""Draft trees only where they measured faster than chains, per batch size.

A draft tree verifies more tokens a step than a chain (21 nodes for ``[3, 2]`` at k = 4, against
5) and costs a wider proposal; it pays only where its extra accepted tokens outweigh both. Which
wins depends on the GPU, the model, the batch size and the text, and a cost model misjudges it
the way it misjudges drafting at all (:mod:`scheduler.payoff_guard`), so the gate measures the
outcome: for each batch size that may draft trees it keeps, per arm (steps that verified a tree,
steps that verified chains), exponentially decayed sums of the tokens those steps appended and
the seconds they took (the step and its proposal), and a step drafts trees iff the tree arm's
tokens per second are at least the chain arm's.

- Until both arms hold ``MIN_EVIDENCE`` steps the gate alternates, the arm with less evidence
  first (a tree configuration starts with trees).
- Afterwards the losing arm runs once every ``PROBE_INTERVAL`` choices of its batch size, so a
  change of text (a copy task after stories) is seen; the loser's share of steps is then at most
  ``1 / PROBE_INTERVAL``.
- Only steady steps are evidence (the engine's :class:`~scheduler.speculation.StepTiming`:
  no prefill, no graph capture), as for the payoff guard.
"""

from __future__ import annotations

from dataclasses import dataclass, field

HALF_LIFE = 32  # steps of one arm over which its evidence's weight halves
MIN_EVIDENCE = 6.0  # an arm's weight (steps) before the arms are compared
PROBE_INTERVAL = 32  # once the arms are compared, the loser runs once in this many choices
_DECAY = 0.5 ** (1.0 / HALF_LIFE)


@dataclass
class Arm:
    """One arm's decayed evidence: tokens appended, seconds taken, steps counted."""

    tokens: float = 0.0
    seconds: float = 0.0
    weight: float = 0.0

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens = self.tokens * _DECAY + tokens
        self.seconds = self.seconds * _DECAY + seconds
        self.weight = self.weight * _DECAY + 1.0

    @property
    def rate(self) -> float:
        """Tokens per second (0 without evidence)."""
        return self.tokens / self.seconds if self.seconds > 0 else 0.0


@dataclass
class BucketArms:
    """One batch size's two arms and its count of choices (for the alternation and probes)."""

    tree: Arm = field(default_factory=Arm)
    chain: Arm = field(default_factory=Arm)
    choices: int = 0


class TreeGate:
    """Whether a step of a given batch size drafts trees (see the module docstring)."""

    def __init__(self) -> None:
        self.buckets: dict[int, BucketArms] = {}
        self.tree_steps = 0  # choices for trees (a metric)
        self.chain_steps = 0  # choices for chains

    def _bucket(self, batch_size: int) -> BucketArms:
        state = self.buckets.get(batch_size)
        if state is None:
            state = self.buckets[batch_size] = BucketArms()
        return state

    def allows(self, batch_size: int) -> bool:
        """One step of ``batch_size`` sequences planned: whether it may draft trees."""
        state = self._bucket(batch_size)
        state.choices += 1
        tree, chain = state.tree, state.chain
        if tree.weight < MIN_EVIDENCE or chain.weight < MIN_EVIDENCE:
            use = tree.weight <= chain.weight  # (the arm with less evidence; trees first)
        else:
            better = tree.rate >= chain.rate
            use = better if state.choices % PROBE_INTERVAL else not better
        if use:
            self.tree_steps += 1
        else:
            self.chain_steps += 1
        return use

    def record(self, batch_size: int, tree: bool, tokens: int, seconds: float) -> None:
        """A steady drafting step of ``batch_size`` sequences, which verified a tree or not,
        appended ``tokens`` tokens in ``seconds`` (the step and its proposal)."""
        if seconds <= 0:
            return
        state = self._bucket(batch_size)
        (state.tree if tree else state.chain).add(tokens, seconds)
