"""What each acceptance method emits, measured with the ``samplers`` package on real logits.

Shared by ``03_samplers.ipynb`` and ``compare_samplers.py``. One forward of the default model over
a chat prompt and a fixed answer gives the target's logits at every answer position; the same
forward through the model's first layers (the early-exit self-draft of :mod:`proposers.early_exit`)
gives a draft's logits there. At one position, ``num_trials`` independent requests each draft one
token and the sampler verifies them in one batched call: the first emitted token (the accepted
draft, or the recovered token at a rejection) is a sample of what speculative decoding outputs.

- Rejection sampling: emitted ~ p, the target's processed distribution, whatever the draft.
- Greedy (argmax match): emitted = argmax p always; equal to p only at temperature 0.
- Typical acceptance (Medusa): draft x kept when ``p(x) > min(posterior_threshold,
  posterior_alpha * exp(-H(p)))``, else argmax p: emitted = ``q(x) [x kept] + (mass of the
  drafts not kept) [x = argmax p]`` (:func:`typical_emitted`), which is not p.

To run many trials fast, the processed distributions keep the ``top_k`` most likely target tokens
(top-k filtering, a part of the processing like temperature) and the sampler sees only those
columns; the draft's distribution is taken over the same tokens.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from prompt_sets import chat_token_ids

from engine import SamplingParams
from proposers.early_exit import early_exit_model
from samplers import SamplingTensors, SpecDecodeMetadata, get_sampler, logits_to_probs

METHODS = ("rejection", "greedy", "typical")
PROMPT = "Write a short story about a cat who learns to sail."
ANSWER = ("Milo was a small grey cat who lived on a boat in the harbour. Every morning he watched "
          "the sailors pull the ropes and raise the white sails. One windy day the sailors went "
          "ashore, and Milo decided it was his turn. He pulled a rope with his teeth, and the sail "
          "filled with wind.")


@dataclass
class Contexts:
    """Target and draft logits at each answer position (over the ``top_k`` target tokens there).

    ``token_ids [num_positions, top_k]``: the vocabulary ids of the kept columns, most likely
    first; ``next_token [num_positions]``: the column of the answer's actual next token, or -1
    when it is not among them (an n-gram draft copying the answer would propose it).
    """

    target_logits: torch.Tensor  # [num_positions, top_k]
    draft_logits: torch.Tensor  # [num_positions, top_k]
    token_ids: torch.Tensor  # [num_positions, top_k]
    next_token: torch.Tensor  # [num_positions]
    num_draft_layers: int


@torch.inference_mode()
def answer_contexts(model: Any, tokenizer: Any, num_draft_layers: int = 24, top_k: int = 50,
                    prompt: str = PROMPT, answer: str = ANSWER) -> Contexts:
    """One forward of the target and of its first ``num_draft_layers`` layers over the chat
    prompt followed by ``answer``; logits at the positions that predict the answer's tokens."""
    prompt_ids = chat_token_ids(tokenizer, prompt)
    answer_ids = list(tokenizer(answer, add_special_tokens=False)["input_ids"])
    ids = torch.tensor([prompt_ids + answer_ids], device=model.device)  # [1, seq_len]
    rows = slice(len(prompt_ids) - 1, ids.shape[1] - 1)
    target = model(ids).logits[0, rows].float()  # [num_positions, vocab_size]
    draft_model = early_exit_model(model, num_draft_layers)
    draft = draft_model(ids).logits[0, rows].float()  # [num_positions, vocab_size]
    top = target.topk(top_k, dim=-1).indices  # [num_positions, top_k]
    actual = torch.tensor(answer_ids, device=model.device).unsqueeze(1)  # [num_positions, 1]
    hit = top == actual  # [num_positions, top_k]
    next_token = torch.where(hit.any(dim=1), hit.int().argmax(dim=1), -1)  # [num_positions]
    return Contexts(target.gather(1, top).cpu(), draft.gather(1, top).cpu(), top.cpu(),
                    next_token.cpu(), num_draft_layers)


def processed_probs(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """The target's processed distribution ``[vocab_size]`` of one logits row (``samplers``'
    own processing: softmax of logits / T, one-hot at the argmax for T = 0)."""
    sampling = SamplingTensors.from_params([SamplingParams(temperature=temperature)])
    return logits_to_probs(logits.unsqueeze(0), sampling, [1])[0]


def make_sampler(method: str, posterior_threshold: float = 0.09,
                 posterior_alpha: float = 0.3) -> Any:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is invalid: allowed {' | '.join(METHODS)}")
    if method == "typical":
        return get_sampler("typical", posterior_threshold=posterior_threshold,
                           posterior_alpha=posterior_alpha)
    return get_sampler(method)


@torch.inference_mode()
def verify_trials(sampler: Any, target_logits: torch.Tensor, temperature: float,
                  num_trials: int, draft_probs: torch.Tensor | None = None,
                  draft_token: int | None = None, seed: int = 0,
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """``num_trials`` one-draft requests at one position, verified in one call.

    ``target_logits [vocab_size]``: raw logits; the sampler processes them at ``temperature``.
    Drafts are sampled from ``draft_probs [vocab_size]`` (probabilistic drafts, passed to the
    sampler), or are all ``draft_token`` (a one-hot draft, as n-gram lookup proposes).
    Returns (emitted first tokens ``[num_trials]``, draft accepted ``[num_trials]``).
    """
    if (draft_probs is None) == (draft_token is None):
        raise ValueError("give exactly one of draft_probs and draft_token")
    if not isinstance(num_trials, int) or num_trials < 1:
        raise ValueError(f"num_trials={num_trials!r} is invalid: allowed an integer >= 1")
    torch.manual_seed(seed)  # drafts and verification draw from the global RNG
    if draft_probs is not None:
        drafts = torch.multinomial(draft_probs, num_trials, replacement=True)
        probs = draft_probs.expand(num_trials, -1)  # [num_trials, vocab_size]
    else:
        drafts = torch.full((num_trials,), draft_token, dtype=torch.int64)
        probs = None
    metadata = SpecDecodeMetadata.from_lists([[d] for d in drafts.tolist()])
    sampling = SamplingTensors.from_params([SamplingParams(temperature=temperature)] * num_trials)
    # Each request owns two rows: its draft position, then its bonus position.
    logits = target_logits.expand(2 * num_trials, -1).contiguous()  # [2 num_trials, vocab_size]
    out = sampler.verify(logits, metadata, sampling, probs)  # [num_trials, 2]
    emitted = out[:, 0]  # [num_trials]
    return emitted, emitted == drafts


def frequencies(tokens: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Empirical distribution ``[vocab_size]`` of ``tokens``."""
    return torch.bincount(tokens, minlength=vocab_size).double() / tokens.numel()


def total_variation(a: torch.Tensor, b: torch.Tensor) -> float:
    """Total-variation distance between two distributions: half the L1 distance."""
    return 0.5 * (a.double() - b.double()).abs().sum().item()


def typical_emitted(p: torch.Tensor, q: torch.Tensor, posterior_threshold: float,
                    posterior_alpha: float) -> torch.Tensor:
    """Exact distribution ``[vocab_size]`` of the first token that typical acceptance emits when
    drafts come from ``q`` and the processed target is ``p`` (the rule stated in the module
    docstring; the entropy is in nats)."""
    p, q = p.double(), q.double()
    entropy = -(p * torch.log(p.clamp_min(1e-300))).sum()
    bar = min(posterior_threshold, posterior_alpha * torch.exp(-entropy).item())
    kept = q * (p > bar)
    emitted = kept.clone()
    emitted[p.argmax()] += 1.0 - kept.sum()
    return emitted


def acceptance_vs_temperature(contexts: Contexts, temperatures: list[float], num_trials: int,
                              draft: str = "early_exit", methods: tuple[str, ...] = METHODS,
                              seed: int = 0) -> dict[str, list[float]]:
    """Mean draft acceptance over the answer positions, per method and temperature.

    ``draft``: ``early_exit`` (drafts sampled from the early-exit layers at the same temperature,
    greedy at T = 0) or ``one_hot`` (the answer's actual next token, where it is among the kept
    tokens: what an n-gram draft copying the answer would propose).
    """
    if draft not in ("early_exit", "one_hot"):
        raise ValueError(f"draft={draft!r} is invalid: allowed early_exit | one_hot")
    positions = range(contexts.target_logits.shape[0])
    if draft == "one_hot":
        positions = [i for i in positions if contexts.next_token[i] >= 0]
    result: dict[str, list[float]] = {m: [] for m in methods}
    for method in methods:
        sampler = make_sampler(method)
        for temperature in temperatures:
            rates = []
            for i in positions:
                kwargs: dict[str, Any] = {}
                if draft == "one_hot":
                    kwargs["draft_token"] = int(contexts.next_token[i])
                else:
                    kwargs["draft_probs"] = processed_probs(contexts.draft_logits[i], temperature)
                _, accepted = verify_trials(sampler, contexts.target_logits[i], temperature,
                                            num_trials, seed=seed + i, **kwargs)
                rates.append(accepted.double().mean().item())
            result[method].append(sum(rates) / len(rates))
    return result


def emitted_distributions(contexts: Contexts, position: int, temperature: float,
                          num_trials: int, seed: int = 0, **typical: float,
                          ) -> dict[str, torch.Tensor]:
    """At one answer position: the processed target ``p``, the early-exit draft ``q``, and the
    empirical distribution of the first emitted token for each method (drafts from ``q``);
    ``typical`` holds ``posterior_threshold`` / ``posterior_alpha`` for typical acceptance."""
    logits = contexts.target_logits[position]
    p = processed_probs(logits, temperature)
    q = processed_probs(contexts.draft_logits[position], temperature)
    out = {"p": p, "q": q}
    for method in METHODS:
        sampler = make_sampler(method, **typical) if method == "typical" else make_sampler(method)
        emitted, _ = verify_trials(sampler, logits, temperature, num_trials, draft_probs=q,
                                   seed=seed)
        out[method] = frequencies(emitted, p.numel())
    return out


def typical_bias(contexts: Contexts, thresholds: list[float], alphas: list[float],
                 temperature: float, num_trials: int, positions: list[int],
                 seed: int = 0) -> dict[str, list[list[float]]]:
    """Total-variation distance between what typical acceptance emits and ``p``, averaged over
    ``positions``, for every (posterior_alpha, posterior_threshold): ``exact`` from
    :func:`typical_emitted`, ``empirical`` from the sampler's ``num_trials`` draws, and the exact
    mean ``acceptance``. ``noise_floor``: the same empirical distance for rejection sampling
    (exact in law, so only sampling noise): a bias below it cannot be told from noise."""
    result: dict[str, list[list[float]]] = {"exact": [], "empirical": [], "acceptance": []}
    ps = [processed_probs(contexts.target_logits[i], temperature) for i in positions]
    qs = [processed_probs(contexts.draft_logits[i], temperature) for i in positions]
    for alpha in alphas:
        rows: dict[str, list[float]] = {"exact": [], "empirical": [], "acceptance": []}
        for threshold in thresholds:
            sampler = make_sampler("typical", threshold, alpha)
            exact, empirical, accepted = [], [], []
            for i, p, q in zip(positions, ps, qs, strict=True):
                emitted = typical_emitted(p, q, threshold, alpha)
                exact.append(total_variation(emitted, p))
                draws, acc = verify_trials(sampler, contexts.target_logits[i], temperature,
                                           num_trials, draft_probs=q, seed=seed + i)
                empirical.append(total_variation(frequencies(draws, p.numel()), p))
                accepted.append(acc.double().mean().item())
            rows["exact"].append(sum(exact) / len(exact))
            rows["empirical"].append(sum(empirical) / len(empirical))
            rows["acceptance"].append(sum(accepted) / len(accepted))
        for key, values in rows.items():
            result[key].append(values)
    floor = []
    for i, p, q in zip(positions, ps, qs, strict=True):
        draws, _ = verify_trials(make_sampler("rejection"), contexts.target_logits[i],
                                 temperature, num_trials, draft_probs=q, seed=seed + i)
        floor.append(total_variation(frequencies(draws, p.numel()), p))
    result["noise_floor"] = [[sum(floor) / len(floor)]]
    return result
