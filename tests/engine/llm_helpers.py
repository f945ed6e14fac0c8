"""Helpers for the engine tests: an offline word-level tokenizer, HF greedy references and a
chi-square p-value. Tiny random models come from ``tests/conftest.py``."""

from __future__ import annotations

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

EOS_ID = 1


def tiny_tokenizer(vocab_size: int) -> PreTrainedTokenizerFast:
    """Token ``i`` is the word ``w<i>``; text is words joined by spaces. ``w1`` is EOS."""
    vocab = {f"w{i}": i for i in range(vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="w0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.decoder = decoders.WordPiece(prefix="##", cleanup=False)
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="w0", eos_token="w1",
                                   bos_token="w2")


def words(ids: list[int]) -> str:
    return " ".join(f"w{i}" for i in ids)


@torch.inference_mode()
def hf_greedy(model, prompt: list[int], max_new_tokens: int) -> list[int]:
    """Hugging Face ``generate(do_sample=False)`` of the target alone, EOS ignored."""
    mask = torch.ones(1, len(prompt), dtype=torch.long)
    out = model.generate(torch.tensor([prompt]), attention_mask=mask, do_sample=False,
                         max_new_tokens=max_new_tokens, eos_token_id=None, pad_token_id=0)
    return out[0, len(prompt):].tolist()


def chi_square_pvalue(counts: torch.Tensor, probs: torch.Tensor,
                      min_expected: float = 5.0) -> float:
    """Pearson's test of ``counts`` against ``probs`` (cells with fewer than ``min_expected``
    expected draws are pooled into one)."""
    counts = counts.double().flatten()
    probs = probs.double().flatten()
    if (counts[probs == 0] > 0).any():
        return 0.0  # draws where the target has no mass
    expected = probs * counts.sum()
    big = expected >= min_expected
    obs, exp = counts[big], expected[big]
    if (~big).any() and expected[~big].sum() > 0:
        obs = torch.cat([obs, counts[~big].sum().reshape(1)])
        exp = torch.cat([exp, expected[~big].sum().reshape(1)])
    stat = ((obs - exp) ** 2 / exp).sum()
    df = len(obs) - 1
    return float(torch.special.gammaincc(torch.tensor(df / 2.0, dtype=torch.float64), stat / 2.0))


def staggered_samples(llm, batch: list[list[int]], params: list, arrivals: list[int]
                      ) -> list[list[list[int]]]:
    """Add prompt ``i`` with ``params[i]`` before engine step ``arrivals[i]``; step until all
    finish. Returns each request's samples' token ids."""
    return [[c.token_ids for c in out.outputs]
            for out in staggered_outputs(llm, batch, params, arrivals)]


def staggered_outputs(llm, batch: list[list[int]], params: list, arrivals: list[int]) -> list:
    """:func:`staggered_samples`, returning each request's ``RequestOutput``."""
    from engine.llm import build_output

    engine = llm.engine
    ids = [f"s{i}" for i in range(len(batch))]
    step = 0
    while step <= max(arrivals) or engine.has_work():
        for i, rid in enumerate(ids):
            if arrivals[i] == step:
                engine.add_request(rid, None, batch[i], params[i])
        engine.step()
        step += 1
    return [build_output(engine.pop_request(rid)) for rid in ids]


def random_head_dir(tmp_path_factory, config):
    """A random draft head for a target of ``config`` (method eagle), saved: its drafts are
    right by chance."""
    from proposers.head_model import head_for

    torch.manual_seed(5)
    head = head_for(config)
    directory = tmp_path_factory.mktemp("head")
    head.save(directory)
    return directory
