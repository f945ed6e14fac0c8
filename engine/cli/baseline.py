"""``--baseline``: the same prompts decoded without speculation, in the same engine and process.

The main job proves its own claim: it decodes the prompts once with every request's speculation
turned off (``SamplingParams.num_speculative_tokens=0``) and once as configured, after a short
warm-up of both modes, so that neither timed run pays first-call costs. It prints both rates, the
speedup, and whether the texts are identical, which greedy (or seeded) decoding promises.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any, TextIO

from engine.outputs import EngineMetrics, RequestOutput
from samplers.sampling_params import SamplingParams

WARMUP_TOKENS = 8


@dataclass
class Comparison:
    """Both runs' outputs and engine metrics (``speculative.measured_speedup`` is set)."""

    outputs: list[RequestOutput]
    baseline_outputs: list[RequestOutput]
    speculative: EngineMetrics
    baseline: EngineMetrics
    sampling: SamplingParams

    @property
    def comparable(self) -> bool:
        """Whether the texts must be equal: greedy or seeded decoding."""
        return self.sampling.greedy or self.sampling.seed is not None

    @property
    def identical(self) -> bool:
        return all(
            [c.token_ids for c in a.outputs] == [c.token_ids for c in b.outputs]
            for a, b in zip(self.outputs, self.baseline_outputs, strict=True))


def compare(llm: Any, prompts: list[Any], sampling: SamplingParams, use_tqdm: bool,
            phase: Any) -> Comparison:
    """Warm up, then time the prompts without and with speculation (``phase(text)`` announces
    each step)."""
    plain = replace(sampling, num_speculative_tokens=0)
    phase("warming up (a few tokens with and without speculation)")
    for params in (plain, sampling):
        llm.generate(prompts[:1], replace(params, max_tokens=WARMUP_TOKENS), use_tqdm=False)
    phase("decoding without speculation (the baseline)")
    llm.reset_metrics()
    baseline_outputs = llm.generate(prompts, plain, use_tqdm=use_tqdm)
    baseline = llm.get_metrics()
    phase("decoding with speculation")
    llm.reset_metrics()
    outputs = llm.generate(prompts, sampling, use_tqdm=use_tqdm)
    return Comparison(outputs, baseline_outputs, llm.get_metrics(baseline.tokens_per_s), baseline,
                      sampling)


def print_comparison(result: Comparison, out: TextIO) -> bool:
    """The baseline's rate, the speedup and the identity check; False when texts that must be
    identical are not."""
    base = result.baseline
    print(f"without speculation: {base.num_generated} tokens in {base.elapsed_s:.2f} s: "
          f"{base.tokens_per_s:.1f} tokens/s", file=out)
    speedup = result.speculative.measured_speedup
    if speedup is not None:
        print(f"speedup: {speedup:.2f}x (both runs in this process, warm)", file=out)
    if not result.comparable:
        print("texts not compared: sampled without a seed, each run draws its own tokens",
              file=out)
        return True
    if result.identical:
        print("identical: the text with speculation is token for token the text without it",
              file=out)
        return True
    print("NOT identical: speculation changed the text of a greedy or seeded request", file=out)
    return False
