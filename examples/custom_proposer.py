"""A proposer of your own, registered from a script: no file of the package changes.

The oracle proposer drafts the target's own greedy continuation, each draft right with
probability ``alpha`` (a wrong draft is a different token): drafts of a known acceptance, which
measure how much of the ideal speedup the engine keeps. Registering it makes ``"oracle"`` a valid
``SpeculativeConfig.method`` (and a choice of the CLI's ``--method`` in this process).

    python examples/custom_proposer.py --alpha 0.8 --max-tokens 48

It first decodes each prompt without speculation (the reference), then again with the oracle at
``--alpha``, checks that the outputs are equal (greedy verification is exact whatever the drafts),
and prints the measured acceptance rate, which should be near ``alpha``.
"""

from __future__ import annotations

import argparse
import random
from collections.abc import Sequence

import _repo_path  # noqa: F401  (a checkout runs without pip install -e .)

from proposers import Proposal, Proposer, ProposeRequest, register_proposer


class OracleProposer(Proposer):
    """Drafts ``references[i][len(context):]`` for the reference that extends the context, each
    token replaced by another with probability ``1 - alpha``; no drafts for an unknown context.

    ``references``: full token sequences (prompt + the target's greedy output). The drafts are
    one-hot (no probabilities) and cost nothing to make.
    """

    drafts_are_free = True

    def __init__(self, references: Sequence[Sequence[int]], alpha: float, vocab_size: int,
                 seed: int = 0) -> None:
        if not 0.0 <= alpha <= 1.0:
            raise ValueError(f"alpha={alpha!r} is invalid: allowed [0, 1]")
        self.references = [list(r) for r in references]
        # the references by their first two tokens: a dict lookup per request and step, so that
        # the oracle's own host time stays negligible beside the engine's
        self.by_start: dict[tuple[int, ...], list[list[int]]] = {}
        for r in self.references:
            self.by_start.setdefault(tuple(r[:2]), []).append(r)
        self.alpha = alpha
        self.vocab_size = vocab_size
        self.rng = random.Random(seed)

    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        return Proposal([self._drafts(list(r.token_ids), r.num_spec_tokens) for r in requests])

    def _drafts(self, context: list[int], k: int) -> list[int]:
        ref = next((r for r in self.by_start.get(tuple(context[:2]), ())
                    if r[:len(context)] == context), None)
        if ref is None:
            return []
        drafts = []
        for token in ref[len(context):len(context) + k]:
            if self.rng.random() >= self.alpha:
                token = (token + 1 + self.rng.randrange(self.vocab_size - 1)) % self.vocab_size
            drafts.append(token)
        return drafts


def register_oracle(name: str, references: Sequence[Sequence[int]], alpha: float) -> None:
    """Register an oracle over ``references`` as the proposer ``name``."""

    @register_proposer(name)
    def build(config, ctx) -> OracleProposer:  # (SpeculativeConfig, ProposerContext)
        return OracleProposer(references, alpha, ctx.vocab_size)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--alpha", type=float, default=0.8, help="acceptance per draft")
    parser.add_argument("-k", type=int, default=4, help="num_speculative_tokens")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--model", default="smollm2-135m")
    args = parser.parse_args(argv)

    from engine import LLM, SamplingParams

    prompts = ["Write a short story about a lighthouse keeper.",
               "Explain why the sky is blue in two sentences."]
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens)
    plain = LLM(args.model)
    outputs = plain.generate(prompts, params, use_tqdm=False)
    references = [o.prompt_token_ids + o.outputs[0].token_ids for o in outputs]

    register_oracle("oracle", references, args.alpha)
    llm = LLM(plain.engine.model, tokenizer=plain.get_tokenizer(), speculative_config={
        "method": "oracle", "num_speculative_tokens": args.k, "adaptive_k": False})
    spec = llm.generate(prompts, params, use_tqdm=False)
    same = all(a.outputs[0].token_ids == b.outputs[0].token_ids
               for a, b in zip(outputs, spec, strict=True))
    metrics = llm.get_metrics()
    print(f"outputs equal to plain greedy decoding: {same}")
    print(f"oracle alpha {args.alpha:.2f}: measured acceptance rate {metrics.acceptance_rate:.2f} "
          f"({metrics.num_accepted}/{metrics.num_drafted} drafts), "
          f"mean accepted length {metrics.mean_accepted_length:.2f} tokens/step")


if __name__ == "__main__":
    main()
