"""The proposers: what a proposal costs beside a verification step (``cost``), what real prompts
accept (``acceptance``), n-gram lookup at scale (``ngram-scale``), early exit's agreement with
the target (``early-exit``), and the draft head: one proposal's host and GPU time (``head-cost``,
CUDA) and its acceptance offline by kind of text (``head-acceptance``)."""

from __future__ import annotations

from benchmarks.registry import Case
from benchmarks.suites import (
    head_acceptance,
    head_cost,
    ngram_scale,
    proposer_acceptance,
    proposer_cost,
)

CASES = {
    "cost": Case("proposal time per step against the target's verification forward",
                 proposer_cost.add_arguments, proposer_cost.run),
    "acceptance": Case("greedy speculative decoding of short tasks: acceptance, tokens a step",
                       proposer_acceptance.add_acceptance_arguments,
                       proposer_acceptance.run_acceptance),
    "ngram-scale": Case("n-gram lookup alone with many long contexts (no model)",
                        ngram_scale.add_arguments, ngram_scale.run),
    "early-exit": Case("how often the first N layers' argmax is the target's greedy token",
                       proposer_acceptance.add_early_exit_arguments,
                       proposer_acceptance.run_early_exit),
    "head-cost": Case("one draft-head proposal: wall, replay GPU time, kernels (CUDA)",
                      head_cost.add_arguments, head_cost.run),
    "head-acceptance": Case("the draft head's acceptance offline, by kind of text",
                            head_acceptance.add_arguments, head_acceptance.run),
}
