"""Draft-model proposer on tiny random models: greedy drafts, cache kept in step, probabilities."""

from __future__ import annotations

import random

import pytest
import torch

from proposers import ProposeRequest
from proposers.draft_model import DraftModelProposer
from samplers import SamplingParams
from tests.conftest import tiny_model
from tests.proposers.proposer_helpers import (
    build,
    draft_proposer,
    draft_runner,
    make_context,
    word_tokenizer,
)

GREEDY = SamplingParams(temperature=0)
VOCAB = 96


@torch.inference_mode()
def last_logits(model, tokens: list[int]) -> torch.Tensor:
    """Oracle: one plain forward over the whole context, no cache; logits of the last position."""
    return model(input_ids=torch.tensor([tokens])).logits[0, -1].float()  # [vocab_size]


@torch.inference_mode()
def hf_greedy(model, tokens: list[int], k: int) -> list[int]:
    out = model.generate(torch.tensor([tokens]), max_new_tokens=k, min_new_tokens=k,
                         do_sample=False, pad_token_id=0)
    return out[0, len(tokens):].tolist()


@pytest.mark.parametrize("family", ["llama", "gpt2"])
@pytest.mark.parametrize("greedy", [True, False])
def test_drafts_equal_the_draft_models_greedy_generate(family, greedy):
    model = tiny_model(family, vocab_size=VOCAB, seed=1)
    proposer = draft_proposer(model, max_num_seqs=4, max_model_len=64, greedy=greedy)
    rng = random.Random(0)
    contexts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (1, 7, 12)]
    ks = [1, 3, 5]
    proposal = proposer.propose([ProposeRequest(i, c, k, GREEDY)
                                 for i, (c, k) in enumerate(zip(contexts, ks, strict=True))])
    assert proposal.draft_token_ids == [hf_greedy(model, c, k)
                                        for c, k in zip(contexts, ks, strict=True)]
    # (temperature 0: the drawn drafts are the argmax, one-hot, given as no probabilities)
    assert proposal.draft_probs is None
    if not greedy:  # one sampled request among them: every draft gets its row
        sampled = ProposeRequest(9, contexts[1], 2, SamplingParams(temperature=0.8, seed=3))
        proposal = proposer.propose([ProposeRequest(0, contexts[0], 1, GREEDY), sampled])
        assert proposal.draft_probs.shape == (3, VOCAB)
        assert proposal.draft_probs[0].max() == 1.0  # (the greedy request's row: one-hot)


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_cache_follows_any_accept_reject_pattern(family):
    """After each verification, the next draft distribution is that of a fresh forward."""
    model = tiny_model(family, vocab_size=VOCAB, seed=2)
    proposer = draft_proposer(model, max_num_seqs=3, max_model_len=128)
    params = SamplingParams(temperature=1.0)
    rng = random.Random(1)
    contexts = {i: [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 9))] for i in range(3)}
    for step in range(12):
        ks = {i: rng.randrange(0, 5) for i in contexts}
        requests = [ProposeRequest(i, list(c), ks[i], params, seed=step * 10 + i)
                    for i, c in contexts.items()]
        proposal = proposer.propose(requests)
        row = 0
        for request, drafts in zip(requests, proposal.draft_token_ids, strict=True):
            assert len(drafts) == request.num_spec_tokens
            if drafts:  # the first draft's row comes from the logits after the whole context
                want = torch.softmax(last_logits(model, request.token_ids), dim=-1)
                torch.testing.assert_close(proposal.draft_probs[row], want, atol=1e-5, rtol=0)
                slot = proposer._seqs[request.req_id].slot
                assert proposer.runner.seq_len(slot) == len(request.token_ids) + len(drafts) - 1
            row += len(drafts)
            # verification: keep a random number of drafts, then a recovered or bonus token
            accepted = rng.randrange(len(drafts) + 1)
            old = len(contexts[request.req_id])
            contexts[request.req_id] += drafts[:accepted] + [rng.randrange(VOCAB)]
            if drafts and rng.random() < 0.5:  # the engine tells; without it the prefix check does
                proposer.on_accepted(request.req_id, old + accepted)
        if step == 6:  # a request finishes, another one joins
            proposer.remove(0)
            contexts[0] = [rng.randrange(VOCAB) for _ in range(5)]


def test_stale_drafts_are_dropped_without_on_accepted():
    """Drafts rejected, no on_accepted, a step without speculation: the cache still catches up."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=2)
    proposer = draft_proposer(model, max_num_seqs=1, max_model_len=64)
    params = SamplingParams(temperature=1.0)
    context = [1, 2, 3, 4]
    drafts = proposer.propose([ProposeRequest(0, context, 4, params, seed=0)]).draft_token_ids
    context = context + [(drafts[0][0] + 1) % VOCAB, 5]  # first draft rejected, one more token
    proposal = proposer.propose([ProposeRequest(0, context, 2, params, seed=1)])
    want = torch.softmax(last_logits(model, context), dim=-1)
    torch.testing.assert_close(proposal.draft_probs[0], want, atol=1e-5, rtol=0)
    assert proposer.runner.seq_len(proposer._seqs[0].slot) == len(context) + 1


def test_probs_are_the_processed_distribution_the_drafts_were_drawn_from():
    model = tiny_model("llama", vocab_size=16, seed=3)
    context = [3, 1, 4, 1, 5]
    bias = torch.zeros(16)
    bias[7] = 3.0

    def adjust(prefix, logits):  # position-dependent, like a penalty: sees context + drafts
        return logits + bias * (len(prefix) - len(context) + 1)

    params = SamplingParams(temperature=0.7, top_k=4)
    num = 600
    proposer = draft_proposer(model, max_num_seqs=num, max_model_len=32)
    requests = [ProposeRequest(i, context, 2, params, adjust, seed=i) for i in range(num)]
    proposal = proposer.propose(requests)
    # Oracle for draft j (prefix = context + drafts before it): adjust, temperature, top 4.
    def oracle(prefix: list[int]) -> torch.Tensor:
        z = adjust(prefix, last_logits(model, prefix)) / 0.7
        kept = z >= torch.topk(z, 4).values[-1]
        return torch.where(kept, torch.softmax(z.masked_fill(~kept, float("-inf")), dim=-1), 0.0)

    want = oracle(context)
    torch.testing.assert_close(proposal.draft_probs[0::2], want.expand(num, 16), atol=1e-6,
                               rtol=0)
    for first in {d[0] for d in proposal.draft_token_ids}:
        rows = [2 * i + 1 for i, d in enumerate(proposal.draft_token_ids) if d[0] == first]
        torch.testing.assert_close(proposal.draft_probs[rows],
                                   oracle(context + [first]).expand(len(rows), 16),
                                   atol=1e-6, rtol=0)
    # Tokens follow their rows: every draft inside its row's support, frequencies match.
    flat = torch.tensor([t for d in proposal.draft_token_ids for t in d])
    assert bool((proposal.draft_probs[torch.arange(2 * num), flat] > 0).all())
    counts = torch.bincount(flat[0::2], minlength=16).float()
    sigma = (num * want * (1 - want)).sqrt()
    assert bool(((counts - num * want).abs() <= 4 * sigma + 1).all()), (counts, num * want)


def test_seeded_drafts_are_reproducible_and_batch_independent():
    model = tiny_model("llama", vocab_size=VOCAB, seed=4)
    params = SamplingParams(temperature=1.2, top_p=0.9)
    context = [5, 9, 2, 7]

    def run(others: int) -> tuple[list[int], torch.Tensor]:
        proposer = draft_proposer(model, max_num_seqs=8, max_model_len=32)
        requests = [ProposeRequest("me", context, 4, params, seed=42, position=3)]
        requests += [ProposeRequest(i, [i + 1] * (i + 2), 3, params) for i in range(others)]
        proposal = proposer.propose(requests[::-1])
        return proposal.draft_token_ids[-1], proposal.draft_probs[-4:]

    alone, alone_probs = run(0)
    crowded, crowded_probs = run(3)
    assert alone == crowded == run(0)[0]
    torch.testing.assert_close(alone_probs, crowded_probs, atol=1e-5, rtol=0)


def test_no_drafts_consume_no_random_numbers():
    model = tiny_model("llama", vocab_size=VOCAB, seed=5)
    generator = torch.Generator().manual_seed(7)
    proposer = DraftModelProposer(draft_runner(model, 2, 32), generator=generator)
    before = generator.get_state()
    proposal = proposer.propose([ProposeRequest(0, [1, 2, 3], 0, SamplingParams())])
    assert proposal.draft_token_ids == [[]]
    assert proposal.draft_probs.shape == (0, VOCAB)
    assert torch.equal(generator.get_state(), before)


def test_narrower_draft_is_zero_padded_to_the_target_width():
    model = tiny_model("llama", vocab_size=VOCAB, seed=6)
    words = [f"w{i}" for i in range(VOCAB)]
    target = tiny_model("llama", vocab_size=VOCAB + 32, seed=6)
    ctx = make_context(target, 1, 32, target_tokenizer=word_tokenizer(words, "target"))
    proposer = build("draft_model", ctx, model=model, tokenizer=word_tokenizer(words, "draft"))
    proposal = proposer.propose([ProposeRequest(0, [4, 5, 6], 3, SamplingParams(), seed=0)])
    assert proposal.draft_probs.shape == (3, VOCAB + 32)
    assert bool((proposal.draft_probs[:, VOCAB:] == 0).all())
    torch.testing.assert_close(proposal.draft_probs.sum(dim=-1), torch.ones(3))


def test_full_draft_cache_stops_drafting_safely():
    model = tiny_model("llama", vocab_size=VOCAB, seed=7)
    proposer = draft_proposer(model, 2, 32, max_num_tokens=10, greedy=True)
    context = [1, 2, 3, 4, 5, 6, 7, 8]
    proposal = proposer.propose([ProposeRequest(0, context, 5, GREEDY)])
    assert proposal.draft_token_ids == [hf_greedy(model, context, 3)]  # 8 + 2 cached tokens fit


@pytest.mark.parametrize("width", [0, -3, 2.5, True])
def test_bad_target_vocab_size(width):
    with pytest.raises(ValueError, match="target_vocab_size"):
        DraftModelProposer(draft_runner(tiny_model("llama", vocab_size=VOCAB), 1, 8),
                           target_vocab_size=width)


def full_greedy(model, tokens: list[int], k: int) -> list[int]:
    """Oracle: the model's greedy continuation, each token from a plain forward over the whole
    context (no cache; ``generate``'s cached steps round differently at this model's ties)."""
    out = list(tokens)
    for _ in range(k):
        out.append(int(last_logits(model, out).argmax()))
    return out[len(tokens):]


def verified(drafts: list[int], accepted: int, token: int, width: int) -> list[int]:
    """A verification's row: the accepted drafts, then ``token``, then placeholders (-1)."""
    return drafts[:accepted] + [token] + [-1] * (width - accepted - 1)


@pytest.mark.parametrize("family", ["llama", "gpt2"])
def test_drafts_on_the_device_are_the_draft_models_greedy_continuation(family):
    """``draft_after`` from a verification (partial, full and no acceptance; rows reserved
    past each request's context), chained, then a proposal from the host after it, each the
    draft model's greedy continuation of the verified context; ``flush`` and a plain step's
    one token (width 1) too."""
    model = tiny_model(family, vocab_size=VOCAB, seed=1)
    proposer = draft_proposer(model, max_num_seqs=4, max_model_len=64)
    rng = random.Random(4)
    contexts = [[rng.randrange(VOCAB) for _ in range(n)] for n in (3, 9, 14)]
    k, width = 3, 4
    proposal = proposer.propose([ProposeRequest(i, c, k, GREEDY) for i, c in enumerate(contexts)])
    drafts = proposal.draft_token_ids
    assert all(proposer.ready_on_device(i, len(c)) for i, c in enumerate(contexts))
    for _ in range(2):  # (a verification of the host's drafts, then one of the device's)
        accepted = [1, k, 0]
        extra = [rng.randrange(VOCAB) for _ in contexts]  # (the recovered or bonus tokens)
        rows = [verified(d, a, x, width) for d, a, x in zip(drafts, accepted, extra, strict=True)]
        base = [len(c) - 1 for c in contexts]  # (each fed token's position)
        out = proposer.draft_after([0, 1, 2], None, torch.tensor(rows), torch.tensor(accepted),
                                   torch.tensor(base), [b + 2 for b in base], k)
        contexts = [c + d[:a] + [x] for c, d, a, x in zip(contexts, drafts, accepted, extra,
                                                          strict=True)]
        drafts = out.tolist()
        assert drafts == [full_greedy(model, c, k) for c in contexts]
        for i, c in enumerate(contexts):  # (the commit: the context is now len(c) tokens)
            proposer.advance(i, len(c) - 1, None, 0, c[-1])
    # a proposal from the host trusts what the device wrote (nothing re-fed but the newest)
    proposal = proposer.propose([ProposeRequest(i, c, 2, GREEDY) for i, c in enumerate(contexts)])
    assert proposal.draft_token_ids == [full_greedy(model, c, 2) for c in contexts]
    # plain steps since (their tokens on the host), flushed, then a plain step's sampled token
    contexts = [c + [rng.randrange(VOCAB) for _ in range(3)] for c in contexts]
    proposer.flush([0, 1, 2], contexts)
    sampled = [rng.randrange(VOCAB) for _ in contexts]
    fed = [len(c) - 1 for c in contexts]
    out = proposer.draft_after([0, 1, 2], None, torch.tensor(sampled)[:, None],
                               torch.zeros(3, dtype=torch.long), torch.tensor(fed), fed, k)
    assert out.tolist() == [full_greedy(model, c + [x], k)
                            for c, x in zip(contexts, sampled, strict=True)]


def test_a_rejection_after_drafting_on_the_device_cuts_the_cache_back():
    """``on_accepted`` below what the device wrote (a stop trimmed the context): the next
    proposal re-feeds from there and drafts the greedy continuation."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=2)
    proposer = draft_proposer(model, max_num_seqs=2, max_model_len=64)
    context = list(range(5, 15))
    drafts = proposer.propose([ProposeRequest(0, context, 3, GREEDY)]).draft_token_ids[0]
    out = proposer.draft_after([0], None, torch.tensor([verified(drafts, 3, 7, 4)]),
                               torch.tensor([3]), torch.tensor([9]), [9], 3)
    assert out.tolist() == [full_greedy(model, context + drafts + [7], 3)]
    proposer.advance(0, len(context) + 3, None, 0, 7)
    proposer.on_accepted(0, len(context))  # (no draft kept)
    changed = context + [(drafts[0] + 1) % VOCAB, 5, 6]  # (it differs from the first draft on)
    proposal = proposer.propose([ProposeRequest(0, changed, 3, GREEDY)])
    assert proposal.draft_token_ids == [full_greedy(model, changed, 3)]


def test_drafts_past_max_model_len_repeat_and_no_rows_give_token_zero():
    """Near ``max_model_len`` the drafts whose positions would pass it repeat the last one;
    without KV rows for the forwards every draft is token 0 (any drafts are exact)."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=2)
    proposer = draft_proposer(model, max_num_seqs=1, max_model_len=16, max_num_tokens=40)
    context = list(range(3, 12))  # (9 tokens; the device forwards reach 11 + 4 + i)
    drafts = proposer.propose([ProposeRequest(0, context, 3, GREEDY)]).draft_token_ids[0]
    out = proposer.draft_after([0], None, torch.tensor([verified(drafts, 0, 5, 4)]),
                               torch.tensor([0]), torch.tensor([8]), [10], 3).tolist()[0]
    first = full_greedy(model, context + [5], 2)
    assert out == [first[0], first[1], first[1]]  # (the third's position would be 16)
    small = draft_proposer(model, max_num_seqs=1, max_model_len=64, max_num_tokens=12)
    drafts = small.propose([ProposeRequest(0, context, 2, GREEDY)]).draft_token_ids[0]
    out = small.draft_after([0], None, torch.tensor([verified(drafts, 2, 5, 3)]),
                            torch.tensor([2]), torch.tensor([8]), [8], 2)
    assert out.tolist() == [[0, 0]]


def test_a_commit_without_a_successor_below_a_drafting_steps_writes_keeps_the_cache_aligned():
    """A drafting step proposed from the host, verified on the device (``draft_after`` wrote
    the recovered token's row), committed with no step after it: ``on_accepted`` cuts the
    slot below that row before ``advance``; the next proposal (after a plain step) re-feeds
    what the slot lacks, and drafts the greedy continuation."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=2)
    rng = random.Random(1)
    proposer = draft_proposer(model, max_num_seqs=2, max_model_len=64)
    context = [rng.randrange(VOCAB) for _ in range(10)]
    n, k = len(context), 3
    drafts = proposer.propose([ProposeRequest(0, context, k, GREEDY)]).draft_token_ids[0]
    token = rng.randrange(VOCAB)
    proposer.draft_after([0], None, torch.tensor([verified(drafts, 0, token, k + 1)]),
                         torch.tensor([0]), torch.tensor([n - 1]), [n - 1], k)
    proposer.on_accepted(0, n)  # (the commit: the sequence has no flight after it)
    proposer.advance(0, n, None, 0, token)
    later = context + [token, rng.randrange(VOCAB)]  # (a plain step since)
    proposal = proposer.propose([ProposeRequest(0, later, k, GREEDY)])
    assert proposal.draft_token_ids == [full_greedy(model, later, k)]


def test_a_catch_up_or_a_device_step_without_rows_leaves_the_request_stale_not_wrong():
    """Without KV rows for them, ``flush`` feeds nothing (no raise: it runs where the engine
    launches a step) and ``draft_after`` gives token 0 without writing; the commit's
    ``advance`` then trusts nothing, the device keeps giving token 0, and a proposal from the
    host that fits brings the request back: the greedy continuation again."""
    model = tiny_model("llama", vocab_size=VOCAB, seed=2)
    rng = random.Random(0)
    proposer = draft_proposer(model, max_num_seqs=2, max_model_len=64, max_num_tokens=37)
    c0 = [rng.randrange(VOCAB) for _ in range(10)]
    c1 = [rng.randrange(VOCAB) for _ in range(20)]
    n, k = len(c0), 3
    d0, _ = proposer.propose([ProposeRequest(0, c0, k, GREEDY),
                              ProposeRequest(1, c1, k, GREEDY)]).draft_token_ids
    token = (d0[1] + 1) % VOCAB
    out = proposer.draft_after([0], None, torch.tensor([verified(d0, 1, token, k + 1)]),
                               torch.tensor([1]), torch.tensor([n - 1]), [n - 1], k)
    assert out.tolist() == [[0] * k]  # (no rows: nothing written)
    proposer.flush([1], [c1 + list(range(30))])  # (no rows for the catch-up: no raise)
    proposer.remove(1)  # (rows free again)
    proposer.advance(0, n + 1, None, 0, token)
    context = c0 + d0[:1] + [token]
    x = rng.randrange(VOCAB)
    out = proposer.draft_after([0], None, torch.tensor([[x] + [-1] * k]),
                               torch.tensor([0]), torch.tensor([n + 1]), [n + k], k)
    assert out.tolist() == [[0] * k]  # (stale: the device does not draft from old rows)
    context += [x]
    proposal = proposer.propose([ProposeRequest(0, context, k, GREEDY)])
    assert proposal.draft_token_ids == [full_greedy(model, context, k)]
    # (its step verified on the device: drafting from there works again)
    out = proposer.draft_after([0], None, torch.tensor([verified(proposal.draft_token_ids[0], 2,
                                                                 5, k + 1)]),
                               torch.tensor([2]), torch.tensor([len(context) - 1]),
                               [len(context) - 1], k)
    context += proposal.draft_token_ids[0][:2] + [5]
    assert out.tolist() == [full_greedy(model, context, k)]
