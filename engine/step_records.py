"""The values one engine step passes from stage to stage (``engine.llm_engine``).

A :class:`SeqStep` is one scheduled sequence's share of a step: scheduled (its context chunk and
the drafts it may ask for), then proposed (its drafts, their probabilities, a tree). Verification
turns each sampling one into a :class:`Verified`. The proposal's timing is a :class:`Proposed`,
the forward's result a :class:`Forwarded`. Nothing here runs a model.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from engine.runner import ForwardOutput
from engine.sequence import Sequence
from scheduler import StepOutcome, StepTiming


@dataclass
class SeqStep:
    """One sequence's share of a step: ``num_context_tokens`` uncached context tokens (a prefill
    chunk, or the newest token when decoding), ``samples`` when the chunk reaches the context's
    end, up to ``num_spec_tokens`` drafts asked for; then what the proposer gave and the step
    kept."""

    seq: Sequence
    num_context_tokens: int
    samples: bool
    num_spec_tokens: int = 0
    drafts: list[int] = field(default_factory=list)  # kept drafts (a tree's nodes)
    draft_probs: torch.Tensor | None = None  # [len(drafts), vocab_size]; None: one-hot
    parents: list[int] | None = None  # a tree's parents (``Proposal.parents``); None: a chain
    backed: int | None = None  # drafts the proposer's evidence backs (None: all)
    depth: int = 0  # drafts as the controller and the metrics count them (a tree's levels)
    # the leading drafts a grammar forced (before the proposer's: engine.grammar_steps)
    forced: int = 0
    # a grammar's token mask per verified position [len(drafts) + 1, words] (int32, host)
    grammar_mask: torch.Tensor | None = None

    @property
    def num_new_tokens(self) -> int:
        return self.num_context_tokens + len(self.drafts)


@dataclass(frozen=True)
class Proposed:
    """How the step's proposal went, for the metrics and the controller's costs. ``seconds``:
    its host time; ``typical``: timed like the proposals after it (not a first look at a
    prompt, not a graph capture); ``after_idle``: the first proposal after steps without one (a
    probe's), no sequence new to the proposer; ``draft_steps``: the most drafts of one
    sequence (the proposer's sequential steps)."""

    asked: bool = False
    seconds: float = 0.0
    typical: bool = False
    after_idle: bool = False
    draft_steps: int = 0


@dataclass(frozen=True)
class Forwarded:
    """The target forward of a step: the sequences still in it (preemption may have taken
    some), the runner's output, the kept logits rows ``[num_tokens + num_sampling,
    vocab_size]`` (each sampling sequence's last context position and drafts; None when nothing
    samples) and when the forward began."""

    items: list[SeqStep]
    output: ForwardOutput
    logits: torch.Tensor | None
    started: float


@dataclass
class Verified:
    """A sampling sequence's verification: its ``tokens`` (accepted drafts, then the recovered
    or bonus token), how many drafts were accepted, its tokens before the step, its first row
    among the kept logits; ``failed`` when its rows were unusable; ``path``: a tree's accepted
    nodes, the root's child first; ``logprob_rows``: its rows' values in the engine's
    ``logprobs_mode`` ``[len(drafts) + 1, vocab_size]`` when it asked for logprobs; ``kept``:
    the tokens the stop checks let through."""

    item: SeqStep
    tokens: list[int]
    num_accepted: int
    num_tokens_before: int
    first_row: int
    failed: bool = False
    path: list[int] | None = None
    logprob_rows: torch.Tensor | None = None
    kept: int = 0


def step_outcome(forwarded: Forwarded | None, proposed: Proposed, verified: list[Verified],
                 updated: list[Sequence], step_s: float, step: int) -> StepOutcome:
    """What a step teaches the speculation controller: every verified sequence's acceptance
    when drafts were proposed, a steady decode step's cost (``ForwardOutput.steady``: not a
    graph bucket's eager first step or capture), and the sequences that left (those of
    ``updated`` that finished)."""
    done = [r for r in verified if not r.failed] if proposed.asked else []
    timing = None
    if (forwarded is not None and forwarded.items and forwarded.output.steady
            and all(item.samples and item.num_context_tokens == 1 for item in forwarded.items)):
        items = forwarded.items
        timed = proposed.typical or proposed.after_idle
        timing = StepTiming(
            len(items), 1 + max(item.depth for item in items), step_s - proposed.seconds,
            max(item.num_spec_tokens for item in items) if timed else 0,
            proposed.seconds if proposed.typical else None,
            proposed.seconds if proposed.after_idle else None,
            forwarded.output.packed_rows, forwarded.output.kv_len, proposed.seconds)
    trees = any(r.item.parents is not None for r in done)
    # (the controller learns the proposer's acceptance: forced drafts come before its own)
    return StepOutcome([r.item.seq for r in done], [r.item.depth for r in done],
                       [max(0, r.num_accepted - r.item.forced) for r in done],
                       [r.item.backed for r in done],
                       [r.path is not None for r in done] if trees else None, timing,
                       [seq for seq in updated if seq.is_finished], step)
