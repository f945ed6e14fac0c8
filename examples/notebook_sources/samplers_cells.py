"""03_samplers.ipynb: what each acceptance method guarantees, on the default model's logits."""

from notebook_sources.common import MACHINE_NOTE, SETUP

CELLS = [
    ("md", """
# What each acceptance method guarantees

The verifier decides which drafts to keep. specdec has three:

- **`rejection_sampler`**: keep draft x with probability min(1, p(x) / q(x)); at the first
  rejection, sample from norm(max(p − q, 0)). Output: exactly p, the target's processed
  distribution, whatever the draft distribution q.
- **`greedy`**: keep while x = argmax p; at the first mismatch emit argmax p. Output: argmax p,
  which is p only at temperature 0.
- **`typical_acceptance_sampler`** (Medusa): keep x when p(x) > min(posterior_threshold,
  posterior_alpha · exp(−H(p))); else emit argmax p. Output: not p, biased towards the drafts
  and the argmax.

Here we check this on real distributions: the default model reads a chat prompt and a fixed
answer; at each answer position we take the target's logits, and as the draft the logits of the
target's first 24 layers (the early-exit self-draft, at its default depth). At one position,
thousands of independent one-draft requests are verified in a single batched call of the
`samplers` package; the histogram of the first emitted token is what speculative decoding
outputs there. To make the
trials cheap, the distributions keep the 50 most likely target tokens (top-k = 50 is part of the
processing, like temperature) and the sampler sees only those columns.

The code is in `sampler_lib.py`; `python examples/compare_samplers.py` prints the same numbers.
""" + MACHINE_NOTE),
    ("code", SETUP),
    ("code", """
import sampler_lib as lib

from engine.runner.loader import load_model

NUM_TRIALS = 2_000 if QUICK else 20_000
model, tokenizer = load_model("smollm2-135m", device=DEVICE)
contexts = lib.answer_contexts(model, tokenizer, num_draft_layers=24, top_k=50)
num_positions = contexts.target_logits.shape[0]
print(f"{num_positions} answer positions, {contexts.target_logits.shape[1]} tokens kept at each")
"""),
    ("md", """
## 1. Emitted tokens against the target's distribution (temperature 1)

We pick the answer position where the target is most uncertain (highest entropy), so the
distribution has many visible bars. Blue bars: p, the target's processed distribution; orange: the
frequency of each token among the emitted ones; the line: the draft distribution q.
"""),
    ("code", """
import matplotlib.pyplot as plt

TEMPERATURE = 1.0
probs = [lib.processed_probs(row, TEMPERATURE) for row in contexts.target_logits]
entropy = [-(p * p.clamp_min(1e-30).log()).sum().item() for p in probs]
position = max(range(num_positions), key=lambda i: entropy[i])
dists = lib.emitted_distributions(contexts, position, TEMPERATURE, NUM_TRIALS)
p, q = dists["p"], dists["q"]

# How far N draws taken directly from p land from p: the sampling noise to compare against.
torch.manual_seed(0)
direct = lib.frequencies(torch.multinomial(p, NUM_TRIALS, replacement=True), p.numel())
print(f"position {position}: entropy {entropy[position]:.2f} nats, "
      f"draft acceptance sum(min(p, q)) = {torch.minimum(p, q).sum():.2f}")
print(f"total variation to p of {NUM_TRIALS} draws made directly from p: "
      f"{lib.total_variation(direct, p):.4f} (sampling noise)")

shown = 15
labels = [repr(tokenizer.decode([t])) for t in contexts.token_ids[position, :shown].tolist()]
fig, axes = plt.subplots(1, 3, figsize=(16, 3.8), sharey=True)
for ax, method in zip(axes, lib.METHODS, strict=True):
    tv = lib.total_variation(dists[method], p)
    print(f"{method:>9}: total variation to p = {tv:.4f}")
    x = torch.arange(shown)
    ax.bar(x - 0.2, p[:shown], width=0.4, label="target p")
    ax.bar(x + 0.2, dists[method][:shown], width=0.4, label="emitted")
    ax.plot(x, q[:shown], "k.-", linewidth=0.8, label="draft q")
    ax.set_xticks(x, labels, rotation=60, fontsize=8)
    ax.set_title(f"{method}: TV to p = {tv:.3f}")
axes[0].set_ylabel("probability")
axes[0].legend()
fig.tight_layout()
plt.show()
"""),
    ("md", """
Rejection sampling lands as close to p as direct sampling does: the drafts change how many target
forwards are needed, never what is emitted. Greedy acceptance emits the argmax every time: at
temperature 1 that is far from p. Typical acceptance keeps the drafts that pass its bar and emits
the argmax otherwise, so it over-weights both.

## 2. Typical acceptance: bias against `posterior_threshold` and `posterior_alpha`

Bias is the total variation between what typical acceptance emits and p, averaged over every
eighth answer position, at temperature 1. Lines: exact (the emitted distribution computed from
the rule, `sampler_lib.typical_emitted`); markers: measured from the sampler's draws; the dotted
line is the same measurement for rejection sampling (unbiased: only sampling noise). Right: the
acceptance rate each setting buys. The bar is min(posterior_threshold, posterior_alpha ·
exp(−H(p))): at temperature 1 the entropy here reaches 4 nats, so posterior_alpha · exp(−H) is
small and sets the bar at most positions; the threshold matters mostly below 0.03.
"""),
    ("code", """
THRESHOLDS = [0.01, 0.09, 0.3] if QUICK else [0.001, 0.003, 0.01, 0.03, 0.09, 0.3]
ALPHAS = [0.1, 0.9] if QUICK else [0.01, 0.03, 0.1, 0.3, 1.0]
positions = list(range(0, num_positions, 16 if QUICK else 8))
bias = lib.typical_bias(contexts, THRESHOLDS, ALPHAS, TEMPERATURE, NUM_TRIALS // 10, positions)

fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4))
for i, alpha in enumerate(ALPHAS):
    line, = left.plot(THRESHOLDS, bias["exact"][i], "-", label=f"posterior_alpha={alpha}")
    left.plot(THRESHOLDS, bias["empirical"][i], "o", color=line.get_color())
    right.plot(THRESHOLDS, bias["acceptance"][i], "o-", label=f"posterior_alpha={alpha}")
left.axhline(bias["noise_floor"][0][0], color="black", linestyle=":",
             label="rejection sampling (noise)")
for ax, ylabel in ((left, "total variation to p"), (right, "draft acceptance rate")):
    ax.set_xscale("log")
    ax.set_xlabel("posterior_threshold")
    ax.set_ylabel(ylabel)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
fig.tight_layout()
plt.show()
print("posterior_alpha  threshold  bias(exact)  bias(measured)  acceptance")
for i, alpha in enumerate(ALPHAS):
    for j, threshold in enumerate(THRESHOLDS):
        print(f"{alpha:15g} {threshold:10g} {bias['exact'][i][j]:12.4f} "
              f"{bias['empirical'][i][j]:15.4f} {bias['acceptance'][i][j]:11.3f}")
"""),
    ("md", """
## 3. Acceptance rate against temperature

Mean acceptance of one draft over the answer positions, for two kinds of draft:

- **early-exit drafts**: sampled from the first 24 layers at the same temperature (their argmax at
  temperature 0), verified with their probabilities q;
- **one-hot drafts**: the answer's actual next token, as n-gram lookup proposes when the answer
  copies text (no draft probabilities: rejection sampling keeps x with probability p(x)).

At temperature 0 all three methods are the same argmax match.
"""),
    ("code", """
TEMPERATURES = [0.0, 1.0] if QUICK else [0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5]
trials = 200 if QUICK else 1_000
fig, axes = plt.subplots(1, 2, figsize=(12, 4), sharey=True)
for ax, draft in zip(axes, ("early_exit", "one_hot"), strict=True):
    rates = lib.acceptance_vs_temperature(contexts, TEMPERATURES, trials, draft=draft)
    for method, values in rates.items():
        ax.plot(TEMPERATURES, values, "o-", label=method)
        print(f"{draft:>10} drafts, {method:>9}: "
              + "  ".join(f"T={t}: {v:.3f}" for t, v in zip(TEMPERATURES, values, strict=True)))
    ax.set_title(f"{draft.replace('_', '-')} drafts")
    ax.set_xlabel("temperature")
    ax.grid(alpha=0.3)
axes[0].set_ylabel("draft acceptance rate")
axes[0].legend()
fig.tight_layout()
plt.show()
"""),
    ("md", """
## Summary

- **Rejection sampling** is the only method whose output is the target's distribution at every
  temperature, whatever the draft (section 1: as close to p as direct sampling, with a draft that
  is accepted 5% of the time there). Its acceptance is Σ min(p, q) for sampled drafts and p(x) for
  a one-hot draft x: here both fall as the temperature flattens p.
- **Greedy** acceptance is exact at temperature 0 only; above it, it emits the argmax whatever the
  temperature asks for. Its acceptance is the chance that the draft is the argmax: constant for
  one-hot drafts, slowly falling for sampled ones.
- **Typical acceptance** accepts more drafts as the temperature rises (its bar falls with the
  entropy), so speculation pays where rejection sampling would reject, but its output is biased
  at every setting measured (section 2): a low bar lets the draft's distribution through, a high
  bar replaces rejected drafts by the argmax. Use it where speed matters more than sampling the
  target's distribution exactly.
"""),
]
