"""04_draft_head.ipynb: the trained draft head (method ``eagle``): its card, lossless drafting,
and its acceptance per draft position."""

from notebook_sources.common import MACHINE_NOTE, SETUP

CELLS = [
    ("md", """
# A trained draft head: drafts on any text

n-gram speculation only helps where the answer copies its context. A *draft head* (EAGLE, Li et
al. 2024) guesses from the target's own hidden states instead, so it can draft on open-ended text
too. specdec ships one for the embedded default model (SmolLM2-135M-Instruct): one small decoder
layer that reads, for every position, the target's final hidden state and the embedding of the
token that came next, attends over the earlier positions through a KV cache of its own, and
predicts the next hidden state; the target's own output head turns the prediction into a draft.
It was trained here, offline, on text the target wrote itself (`examples/train_draft_head.py`).

This notebook shows the head's card (how it was trained and how well it drafts held-out text),
that drafting with it changes nothing in the output, and how often each draft position is
accepted.
""" + MACHINE_NOTE),
    ("code", SETUP),
    ("md", """
## 1. The shipped head and its card

`method="eagle"` with no `model` loads `proposers/heads/smollm2-135m/`: the weights
(safetensors) and `draft_head.json`, its shape, training command, data and per-epoch held-out
acceptance (4 chained greedy drafts from every answer position of 180 prompts on topics the
training never saw; a draft counts while it equals the target's greedy text).
"""),
    ("code", """
import json

import matplotlib.pyplot as plt

from proposers.draft_head import DEFAULT_HEAD_DIR

card = json.loads((DEFAULT_HEAD_DIR / "draft_head.json").read_text())
print({k: card[k] for k in ("version", "hidden_size", "num_heads", "num_kv_heads",
                            "intermediate_size")})
print("trained by:", card["command"])
last = card["history"][-1]
print(f"held-out after epoch {last['epoch']}: first draft {last['first_draft']:.3f}, "
      f"per position {[round(x, 3) for x in last['per_position']]}, "
      f"mean accepted {last['mean_accepted']:.2f} of 4 drafts")
if "copy" in last:
    print(f"held-out copy tasks: first draft {last['copy']['first_draft']:.3f}, "
          f"mean accepted {last['copy']['mean_accepted']:.2f} of 4 drafts")
print("draft vocabulary:", card.get("draft_vocab_size"), "tokens")

epochs = [h["epoch"] for h in card["history"]]
fig, ax = plt.subplots(figsize=(6, 3.2))
ax.plot(epochs, [h["first_draft"] for h in card["history"]], marker="o", label="first draft")
ax.plot(epochs, [h["mean_accepted"] / 4 for h in card["history"]], marker="s",
        label="mean accepted / 4")
ax.set_xlabel("epoch")
ax.set_ylabel("held-out rate")
ax.set_title("The shipped head during training (from its card)")
ax.legend()
plt.show()
"""),
    ("md", """
## 2. Drafting with the head is lossless

Greedy output with the head equals the target's alone, token for token: every draft is checked by
the target's own forward, and only agreed tokens (plus one of the target's) are kept. The `eagle`
preset drafts 2 tokens every step (`adaptive_k` off), what measured fastest on a GPU.
"""),
    ("code", """
from engine import LLM, SamplingParams

MAX_TOKENS = 24 if QUICK else 96
prompts = ["Explain how rainbows form, in a short paragraph.",
           "Write a short story about a robot who learns to paint."][:1 if QUICK else 2]
params = SamplingParams(temperature=0, max_tokens=MAX_TOKENS)
plain = LLM(model="smollm2-135m", device=DEVICE, max_num_seqs=4, max_model_len=1024)
head = LLM(model="smollm2-135m", device=DEVICE, max_num_seqs=4, max_model_len=1024,
           speculative_config={"method": "eagle", "num_speculative_tokens": 2,
                               "adaptive_k": False})
messages = [[{"role": "user", "content": p}] for p in prompts]
without = plain.chat(messages, params, use_tqdm=False)
with_head = head.chat(messages, params, use_tqdm=False)
same = all(a.outputs[0].token_ids == b.outputs[0].token_ids
           for a, b in zip(without, with_head, strict=True))
print("same text with and without the draft head:", same)
print(with_head[0].outputs[0].text[:300])
"""),
    ("md", """
## 3. Acceptance per draft position

The engine counts, for each draft position, how often a draft there was accepted when it was
verified. With a fixed k every step verifies both drafts, so the rates below are the head's on
this text. A second draft is accepted only when the first is too: its rate over the first's is
the conditional one. These prompts are phrased unlike the training templates, and the head
accepts less here than on its held-out prompts (section 1).
"""),
    ("code", """
metrics = head.get_metrics()
print(f"acceptance rate {metrics.acceptance_rate:.2f} "
      f"({metrics.num_accepted} of {metrics.num_drafted} drafts), "
      f"mean accepted length {metrics.mean_accepted_length:.2f} tokens per step")
print("acceptance per position:", [round(x, 3) for x in metrics.acceptance_per_position])

fig, ax = plt.subplots(figsize=(5, 3))
ax.bar([str(i + 1) for i in range(len(metrics.acceptance_per_position))],
       metrics.acceptance_per_position)
ax.set_xlabel("draft position")
ax.set_ylabel("accepted / drafted")
ax.set_title("The head's drafts in the engine")
plt.show()
"""),
    ("md", """
## 4. Where it pays

Measured on an H100 with the default model in bf16 (`docs/performance.md`, "Draft head";
`python -m benchmarks e2e`, 128 greedy tokens per prompt), with the adaptive controller: 1.20x
the engine without speculation on open-ended prompts at batch 1, 0.96x at batch 8 and 0.95x at
batch 32; with 4 drafts every step, 1.36x at batch 1. On copy-heavy prompts n-gram is the better
proposer (1.62x at batch 1), and the combined `ngram_eagle` (n-gram where the text has a match,
the head elsewhere) takes the better of the two at batch 1: 1.32x on open prompts, 1.82x on copy
prompts. The whole proposal replays one CUDA graph there.

On this CPU it pays too. A verification forward costs about what a decode step does (the
decoder's linear maps run on oneDNN-reordered weights), and the head drafts from a draft
vocabulary of 16,384 tokens instead of the whole 49,152-wide output head (a proposal of 2 drafts
took about 13 ms against a 65 ms step). With the adaptive controller at batch 1: 1.49x on open
prompts, 1.17x on copy prompts, and `ngram_eagle` 1.45x and 1.86x. The timings of the short run
above (`LLM.get_metrics`) are one sample of that.

To train a head for another model or on other text:
`python examples/train_draft_head.py --model PATH --device cuda --out DIR`, then
`speculative_config={"method": "eagle", "model": DIR}`.
"""),
]
