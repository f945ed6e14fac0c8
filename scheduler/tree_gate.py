"""Draft trees only where they measured faster than chains, per batch size.

A draft tree verifies more tokens a step than a chain (21 nodes for ``[3, 2]`` at k = 4, against
5) and costs a wider proposal; it pays only where its extra accepted tokens outweigh both. Which
wins depends on the GPU, the model, the batch size and the text, and a cost model misjudges it
the way it misjudges drafting at all (:mod:`scheduler.payoff_guard`), so the gate measures the
outcome: for each batch size that may draft trees it keeps, per arm (steps that verified a tree,
steps that verified chains), exponentially decayed sums of the tokens those steps appended and
the seconds they took (the step and its proposal), and a step drafts trees iff the tree arm's
tokens per second are at least the chain arm's.

- Until both arms hold ``MIN_EVIDENCE`` steps the gate alternates, the arm with fewer steps
  first (a tree configuration starts with trees).
- Afterwards the losing arm runs once every ``PROBE_INTERVAL`` choices of its batch size, so a
  change of text (a copy task after stories) is seen; the loser's share of steps is then at most
  ``1 / PROBE_INTERVAL``.
- Both arms' sums decay at every recorded step of their batch size, whichever arm it was: an
  arm's rate is that of its recent steps in engine time, so a loser's probes count as fully as
  the winner's steps (decayed per own step, a probe would weigh 1/32 of an old history, and a
  loser that got better would be seen some 25 times later than a winner that got worse).
- Only steady steps in which the gate was asked are evidence (the engine's
  :class:`~scheduler.speculation.StepTiming`: no prefill, no graph capture; a step whose
  sequences could draft no tree, e.g. seeded or penalised ones, measures other requests and is
  left out).
"""

from __future__ import annotations

from dataclasses import dataclass, field

HALF_LIFE = 32  # recorded steps (of either arm) over which evidence's weight halves
MIN_EVIDENCE = 6  # steps each arm has run before the arms are compared
PROBE_INTERVAL = 32  # once the arms are compared, the loser runs once in this many choices
_DECAY = 0.5 ** (1.0 / HALF_LIFE)


@dataclass
class Arm:
    """One arm's decayed evidence (tokens appended, seconds taken) and its count of steps."""

    tokens: float = 0.0
    seconds: float = 0.0
    steps: int = 0

    def decay(self) -> None:
        self.tokens *= _DECAY
        self.seconds *= _DECAY

    def add(self, tokens: int, seconds: float) -> None:
        self.tokens += tokens
        self.seconds += seconds
        self.steps += 1

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
        if tree.steps < MIN_EVIDENCE or chain.steps < MIN_EVIDENCE:
            use = tree.steps <= chain.steps  # (the arm with fewer steps; trees first)
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
        state.tree.decay()
        state.chain.decay()
        (state.tree if tree else state.chain).add(tokens, seconds)
