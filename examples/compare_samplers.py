"""What rejection, greedy and typical acceptance emit, against the target's distribution.

The plain-script form of ``03_samplers.ipynb``, on the default model's logits (see
``sampler_lib``): at the most uncertain answer position, the total-variation distance between
the emitted tokens and the target's processed distribution p for each method; the bias of typical
acceptance for each (posterior_alpha, posterior_threshold); the draft acceptance rate against
temperature for early-exit and one-hot drafts. ``--json`` writes the numbers.

    python examples/compare_samplers.py --quick
"""

from __future__ import annotations

import argparse
import json

import _repo_path  # noqa: F401  (the repository root on sys.path)
import sampler_lib as lib
import torch

from engine.runner.loader import load_model


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="auto", help="auto (GPU when there is one), cpu, cuda")
    parser.add_argument("--draft-layers", type=int, default=24,
                        help="layers of the early-exit draft (default 24 of 30)")
    parser.add_argument("--trials", type=int, default=20_000,
                        help="requests verified per histogram (default 20000)")
    parser.add_argument("--temperatures", nargs="+", type=float,
                        default=[0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5])
    parser.add_argument("--thresholds", nargs="+", type=float,
                        default=[0.001, 0.003, 0.01, 0.03, 0.09, 0.3])
    parser.add_argument("--alphas", nargs="+", type=float,
                        default=[0.01, 0.03, 0.1, 0.3, 1.0])
    parser.add_argument("--quick", action="store_true", help="fewer trials and settings")
    parser.add_argument("--json", metavar="PATH", help="write the numbers as JSON")
    args = parser.parse_args(argv)
    if args.quick:
        args.trials, args.temperatures = 2_000, [0.0, 1.0]
        args.thresholds, args.alphas = [0.01, 0.09, 0.3], [0.1, 0.9]
    if args.trials < 100:
        parser.error(f"--trials {args.trials}: allowed an integer >= 100")
    if any(t < 0 for t in args.temperatures):
        parser.error(f"--temperatures {args.temperatures}: allowed numbers >= 0")
    for name in ("thresholds", "alphas"):
        if any(not 0 < v <= 1 for v in getattr(args, name)):
            parser.error(f"--{name} {getattr(args, name)}: allowed numbers in (0, 1]")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = ("cuda" if torch.cuda.is_available() else "cpu") if args.device == "auto" \
        else args.device
    model, tokenizer = load_model("smollm2-135m", device=device)
    contexts = lib.answer_contexts(model, tokenizer, num_draft_layers=args.draft_layers)
    num_positions = contexts.target_logits.shape[0]
    report: dict = {"args": vars(args)}

    probs = [lib.processed_probs(row, 1.0) for row in contexts.target_logits]
    entropy = [-(p * p.clamp_min(1e-30).log()).sum().item() for p in probs]
    position = max(range(num_positions), key=lambda i: entropy[i])
    dists = lib.emitted_distributions(contexts, position, 1.0, args.trials)
    report["total_variation_to_p"] = {
        m: lib.total_variation(dists[m], dists["p"]) for m in lib.METHODS}
    print(f"position {position} (entropy {entropy[position]:.2f} nats), temperature 1, "
          f"{args.trials} trials: total variation to p")
    for method, tv in report["total_variation_to_p"].items():
        print(f"  {method:>9}: {tv:.4f}")

    positions = list(range(0, num_positions, 8))
    bias = lib.typical_bias(contexts, args.thresholds, args.alphas, 1.0, args.trials // 10,
                            positions)
    report["typical_bias"] = bias
    print(f"typical acceptance at temperature 1 (rejection sampling's noise floor "
          f"{bias['noise_floor'][0][0]:.4f})")
    print("  posterior_alpha  threshold  bias(exact)  bias(measured)  acceptance")
    for i, alpha in enumerate(args.alphas):
        for j, threshold in enumerate(args.thresholds):
            print(f"  {alpha:15g} {threshold:10g} {bias['exact'][i][j]:12.4f} "
                  f"{bias['empirical'][i][j]:15.4f} {bias['acceptance'][i][j]:11.3f}")

    trials = max(args.trials // 20, 100)
    report["acceptance_vs_temperature"] = {}
    for draft in ("early_exit", "one_hot"):
        rates = lib.acceptance_vs_temperature(contexts, args.temperatures, trials, draft=draft)
        report["acceptance_vs_temperature"][draft] = rates
        print(f"acceptance rate, {draft} drafts, temperatures {args.temperatures}")
        for method, values in rates.items():
            print(f"  {method:>9}: " + "  ".join(f"{v:.3f}" for v in values))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)


if __name__ == "__main__":
    main()
