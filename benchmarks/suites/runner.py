"""One step of the model runner, timed: against a Hugging Face forward (``vs-hf``), a step that
admits a prompt beside decoding sequences by layout (``mixed``), and a verification step of
unequal drafts padded or packed (``packed``), and a few rows through a weight by cuBLAS or the
few-rows kernel (``products``). Each case's module says what it measures."""

from __future__ import annotations

from benchmarks.registry import Case
from benchmarks.suites import runner_mixed, runner_packed, runner_products, runner_vs_hf

CASES = {
    "vs-hf": Case("decode and verify steps: the runner against HF over a DynamicCache",
                  runner_vs_hf.add_arguments, runner_vs_hf.run),
    "mixed": Case("a step admitting a prompt: folded, split, padded, against decode only",
                  runner_mixed.add_arguments, runner_mixed.run),
    "packed": Case("a verification step of unequal drafts: padded, packed, against decode",
                   runner_packed.add_arguments, runner_packed.run),
    "products": Case("a few rows through a weight: cuBLAS against the few-rows product kernel",
                     runner_products.add_arguments, runner_products.run),
}
