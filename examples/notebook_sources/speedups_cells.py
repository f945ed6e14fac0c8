"""02_speedups.ipynb: where speculation pays, per method, k, prompt kind and batch size."""

from notebook_sources.common import MACHINE_NOTE, SETUP

CELLS = [
    ("md", """
# Where speculative decoding pays: tokens/s per method, k, prompt kind and batch size

Speculation trades extra work for fewer sequential target steps. It pays when the drafts are
often accepted and cheap to make and check. This notebook measures, on the default model
(SmolLM2-135M-Instruct), greedy decoding of:

- **prompts whose answer copies from the prompt**: rename a variable in code, quote a paragraph,
  reformat a list (`prompt_sets.COPY_PROMPTS`);
- **open-ended prompts**: a story, an explanation, advice (`prompt_sets.OPEN_PROMPTS`);

with the engine without speculation; with each proposer: n-gram prompt lookup, the early-exit
self-draft (the target's first layers, at the default depth: 24 of 30), the draft head shipped
for the default model (`eagle`) and `ngram_eagle` (n-gram where the text has a match, the head
elsewhere); and Hugging Face `generate`, plain and with `prompt_lookup_num_tokens=k` (its prompt
lookup works at batch 1 only); at batch 1 (prompts one after another) and at a batch of 16 (all
submitted at once). Each proposer runs twice over: at fixed k (`adaptive_k=False`, so that each
k is measured as such: k = 1, 2, 4, 8 at batch 1, 2 and 4 at batch 16), and with **the default
policy** (`adaptive_k=True`, what `LLM(...)` does unless told otherwise: the controller chooses
0 to 4 drafts per step from the acceptance and the step costs it measures). One prompt of each
kind (edit code; a story), up to 32 tokens, so that it runs in minutes on a CPU: set `KS`,
`BATCHED_KS` and `NUM_PROMPTS` below for more (`compare_speedups.py` runs all prompts by
default). Every run decodes the same token ids greedily, so the engine's outputs are the same
tokens as Hugging Face's (checked below).

The measuring code is in `speedup_lib.py` and the plots in `speedup_plots.py`;
`python examples/compare_speedups.py --help` runs the same comparison as a script.
""" + MACHINE_NOTE),
    ("code", SETUP),
    ("code", """
if QUICK:
    KS, BATCHED_KS, POLICY_K, BATCH_SIZES, MAX_TOKENS, NUM_PROMPTS = [2], [2], 2, [1, 2], 8, 1
else:
    KS, BATCHED_KS, POLICY_K = [1, 2, 4, 8], [2, 4], 4
    BATCH_SIZES, MAX_TOKENS, NUM_PROMPTS = [1, 16], 32, 1
print(f"fixed k in {KS} at batch 1 and {BATCHED_KS} at batch {BATCH_SIZES[1]}; the default "
      f"policy with k <= {POLICY_K}; up to {MAX_TOKENS} new tokens, {NUM_PROMPTS} prompt(s) of "
      "each kind")
"""),
    ("md", """
## 1. Measure

One line per run as it completes (this is the slow cell). Each engine is built once per (method,
k or policy, batch size) on the already-loaded weights and warmed up with a two-token request.
"""),
    ("code", """
import time

import speedup_lib as lib

model, tokenizer = lib.load_default_model(DEVICE)


def log(m):
    k = f"<={m.k} (policy)" if m.policy else f"{m.k}"
    print(f"{m.kind:<4} batch {m.batch_size:>2} {lib.LABELS[m.method]:<30} k={k}: "
          f"{m.num_tokens:4d} tokens in {m.seconds:6.1f} s = {m.tokens_per_s:6.2f} tokens/s",
          flush=True)


start = time.perf_counter()
results = lib.run_sweep(model, tokenizer, ("copy", "open"), lib.METHODS, KS, BATCH_SIZES,
                        MAX_TOKENS, NUM_PROMPTS, log, batched_ks=BATCHED_KS,
                        policy_k=POLICY_K)
print(f"{len(results)} runs in {time.perf_counter() - start:.0f} s")
"""),
    ("md", """
## 2. The table

`speedup`: tokens/s over the engine's without speculation on the same prompts and batch size.
`k`: the fixed number of drafts a step, or `<=4` for the default policy (at most 4).
`alpha`: per-token acceptance (accepted / tested drafts; a draft is tested when no earlier draft
of its step was rejected). `c`: cost of one draft step over one target step, measured by the
engine. `pred.`: Leviathan's S = (1 − α^(k+1)) / ((1 − α)(k c + 1)) from this run's α, k and c.
"""),
    ("code", """
print(lib.format_table(results))
"""),
    ("code", """
# Greedy speculation is lossless: the engine's tokens must equal Hugging Face generate's.
for batch_size in BATCH_SIZES:
    for kind in ("copy", "open"):
        reference = lib.find(results, "hf", kind, batch_size)[0].outputs
        engine_runs = [m for m in results if m.kind == kind and m.batch_size == batch_size
                       and m.method in lib.ENGINE_METHODS]
        same = sum(m.outputs == reference for m in engine_runs)
        print(f"batch {batch_size:>2}, {kind}: {same} of {len(engine_runs)} engine runs "
              f"produced exactly HF generate's tokens")
"""),
    ("md", """
At batch 1 every engine run should match Hugging Face token for token. At batch 16 Hugging Face
pads the prompts on the left, which changes floating-point sums slightly; where two tokens are
nearly tied, its greedy choice can then differ from the unpadded one, so a mismatch there is not
an engine error.

## 3. Tokens/s per method

Solid black: the engine without speculation; dashed grey: Hugging Face `generate`; dotted, in
each proposer's colour: that proposer under the default policy (no fixed k).
"""),
    ("code", """
import matplotlib.pyplot as plt
import speedup_plots as plots

plots.plot_tokens_per_s(results)
plt.show()
"""),
    ("md", """
## 4. Acceptance per draft position

For the largest fixed k, drafts accepted at position i over drafts verified at position i (the
engine's `acceptance_per_position`, the definition every notebook here uses). A draft after a
rejected one counts as verified and not accepted, so this is the unconditional rate: the chance
that a step keeps at least i drafts. It can only fall with i; the conditional rate (accepted at
i given that the i − 1 before were) is the ratio of two neighbouring points.
"""),
    ("code", """
plots.plot_acceptance_per_position(results)
plt.show()
"""),
    ("md", """
## 5. Measured speedup against Leviathan's prediction

Solid: measured tokens/s over the engine without speculation; dashed: the prediction from the
same run's α and c. The formula counts a step with k drafts as costing k c + 1 plain steps:
scoring k + 1 positions is assumed to cost the target the same as scoring one, and every step is
assumed to draft k tokens. On a CPU a forward over k + 1 tokens costs more than one over a single
token, and n-gram lookup finds nothing to propose on some steps, so the measurement falls below
the prediction, more so as k grows. The best k is where the solid curve peaks.
"""),
    ("code", """
plots.plot_speedup_vs_theory(results)
plt.show()
"""),
    ("code", """
# The best k per method, prompt kind and batch size.
for batch_size in BATCH_SIZES:
    for kind in ("copy", "open"):
        for method in (*lib.SPEC_METHODS, "hf_prompt_lookup"):
            runs = lib.find(results, method, kind, batch_size)
            if runs:
                best = max(runs, key=lambda m: m.tokens_per_s)
                predicted = best.predicted_speedup
                policy = lib.find(results, method, kind, batch_size, policy=True)
                print(f"batch {batch_size:>2}, {kind:<4} {lib.LABELS[method]:<30} best k={best.k}: "
                      f"{lib.measured_speedup(best, results):.2f}x measured"
                      + (f", {predicted:.2f}x predicted" if predicted is not None else "")
                      + (f"; default policy {lib.measured_speedup(policy[0], results):.2f}x"
                         if policy else ""))
"""),
    ("md", """
## Reading the results

The committed run (first code cell: the project's shared 2-core CPU, 2 torch threads, with other
jobs running at the same time; one prompt of each kind, 32 tokens) is noisy: the same work timed
twice can differ by a third or more (Hugging Face `generate` without speculation measured 0.60x
to 1.69x the engine without speculation on the same prompts, which no code explains). Read the
acceptance (`alpha`, exact: greedy decoding is deterministic) and the cost ratio `c` first, and
only large differences in tokens/s. With that caution:

- **Lossless**: every engine run, every proposer, fixed k or the policy, batch 1 or 16, produced
  exactly Hugging Face's greedy tokens.
- **n-gram lookup** drafts for free (c ≈ 0). On the copy prompt alpha ≈ 0.62 to 0.72 and it
  measured 1.38x to 1.95x at batch 1 (the default policy 1.95x). On the open prompt nothing
  matches (alpha = 0): at fixed k every draft is wasted verification (0.74x to 0.96x); the
  default policy stops drafting there (0.94x at batch 1, 1.02x at batch 16: no speculation,
  within the noise).
- **The draft head** (`eagle`) drafts on any text: alpha ≈ 0.53 to 0.63 on the copy prompt and
  ≈ 0.29 to 0.32 on the open one, at c ≈ 0.03 to 0.09 (its draft vocabulary is a third of the
  target's). Leviathan predicts 1.5x to 1.9x on copy and 1.0x to 1.25x on open text; the
  measurements scatter around that (0.69x to 2.01x). `ngram_eagle` (n-gram where the text has a
  match, the head elsewhere) was the fastest on the copy prompt at batch 16 (2.14x at k = 2) and
  behind n-gram alone at batch 1 in this run.
- **The early-exit self-draft** (24 of 30 layers per draft, c ≈ 0.4 to 0.8) gets alpha ≈ 0.23
  to 0.42: the prediction is below 1 at every k and so are the fixed-k measurements (0.18x to
  0.84x). Under the default policy it still drafted at batch 1 (alpha 0.33 to 0.42) and lost
  (0.64x to 0.72x); at batch 16 the controller tried a few drafts and then kept to plain steps
  (alpha 0.00 to 0.03), as fast as no speculation within the noise. On a model not trained to
  exit early no depth pays (LayerSkip-trained targets are what it is for).
- **Fixed k against the policy**: the best fixed k differs per proposer, prompt and batch size
  (the table's `best k`); the default policy has no k to choose. It measured 0.59x to 2.01x:
  where fixed k clearly loses (n-gram on open text, early exit at batch 16) it stopped drafting;
  elsewhere it landed above or below the best fixed k by about this run's noise, except
  `ngram_eagle` on the open prompt at batch 1 (0.59x against 1.10x at k = 1), which one noisy
  run cannot settle.
- **Acceptance per position** (section 4) falls with the position for every proposer, fastest
  for early exit and the head on open text: the chance that a step keeps i drafts.
- The numbers and the best k depend on the machine and its load: rerun this notebook (or
  `compare_speedups.py`) on yours; `python -m benchmarks e2e` measures more prompts and tokens.
"""),
]
