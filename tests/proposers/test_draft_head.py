"""The draft head (method ``eagle``): its weights' round trip, its cached drafts against a
written-out oracle, the features the engine hands it, and greedy output equal to Hugging Face's
with it on (batches, staggered arrivals, chunked prefill, preemption)."""

from __future__ import annotations

import copy
import json
from functools import partial

import pytest
import torch

from engine import LLM, SamplingParams
from proposers.base import FeatureUpdate, ProposeRequest
from proposers.draft_head import DEFER_STEPS, DraftHeadProposer, beside
from proposers.head_model import DraftHead, head_for
from samplers.chain_accept import accept_chains
from tests.conftest import tiny_model
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer

VOCAB = 96


def random_head(config, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = head_for(config)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return head.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, num_layers=2, seed=3)


def save_repeating_head(config, directory) -> None:
    """A head whose drafts repeat the newest token: its prediction is the normed feature
    itself (no attention or MLP output), whose argmax is the token the feature gave. A tiny
    target repeats tokens often, so some drafts are accepted and some rejected."""
    head = random_head(config)
    hidden = config.hidden_size
    with torch.no_grad():
        head.o_proj.weight.zero_()
        head.down.weight.zero_()
        head.fc.weight.copy_(torch.cat([torch.eye(hidden), torch.zeros(hidden, hidden)], 1))
        head.feature_norm.weight.fill_(1.0)
    head.save(directory, {"trained": "no (a test head)"})


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    """:func:`save_repeating_head` for the tiny target."""
    directory = tmp_path_factory.mktemp("head")
    save_repeating_head(target.config, directory)
    return directory


def test_a_saved_head_loads_with_the_same_weights_and_bad_directories_are_named(tmp_path,
                                                                                  target):
    head = random_head(target.config, seed=1)
    head.save(tmp_path / "h")
    loaded = DraftHead.load(tmp_path / "h")
    for name, tensor in head.state_dict().items():
        torch.testing.assert_close(loaded.state_dict()[name], tensor, rtol=0, atol=0)
    assert loaded.shape() == head.shape()
    config = json.loads((tmp_path / "h" / "draft_head.json").read_text())
    (tmp_path / "h" / "draft_head.json").write_text(json.dumps({**config, "version": 1}))
    with pytest.raises(ValueError, match="version=1"):
        DraftHead.load(tmp_path / "h")
    (tmp_path / "h" / "draft_head.safetensors").unlink()
    with pytest.raises(ValueError, match="draft_head.safetensors"):
        DraftHead.load(tmp_path / "h")


def oracle_drafts(head, embed, lm_head, features, tokens, steps) -> list[int]:
    """Written out: the pairs (``f_j``, ``x_{j+1}``) of the whole context as one causal
    sequence, each draft a fresh full forward with the previous prediction and its argmax
    appended as the next pair; no cache, no batching, no padding."""
    feats, toks = list(features), list(tokens[1:])
    drafts = []
    for _ in range(steps):
        pred = head_prediction(head, embed, feats, toks)
        token = int(lm_head(pred).argmax())
        drafts.append(token)
        feats.append(pred)
        toks.append(token)
    return drafts


@torch.no_grad()
def head_prediction(head, embed, feats: list[torch.Tensor], toks: list[int]) -> torch.Tensor:
    """The head's prediction ``[hidden_size]`` at the last of the pairs (``feats[j]``,
    ``toks[j]``), taken as one causal sequence: no cache, no batching, no padding."""
    n = len(toks)
    x = head.inputs(torch.stack(feats)[None], embed(torch.tensor([toks])))
    pos = torch.arange(n)[None]
    k, v = head.keys_values(x, pos)
    causal = torch.ones(n, n, dtype=torch.bool).tril()[None]
    return head.attend(x, pos, k, v, causal)[0, -1]


def hidden_of(model, tokens: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return model(input_ids=torch.tensor([tokens]),
                     output_hidden_states=True).hidden_states[-1][0]  # [len, hidden]


def make_proposer(target, head, graphs: bool = False, max_pending: int = 4,
                  defer_steps: int = DEFER_STEPS):
    return DraftHeadProposer(head, target.get_input_embeddings(),
                             target.get_output_embeddings(), VOCAB, max_num_seqs=4,
                             max_model_len=64, max_pending=max_pending, graphs=graphs,
                             capture=False, defer_steps=defer_steps)


def feed(proposer, target, contexts: dict, verified: dict) -> None:
    """Hand ``verified[req] = (start, count)`` features of each request's context."""
    updates, rows = [], []
    for req, (start, count) in verified.items():
        tokens = contexts[req]
        updates.append(FeatureUpdate(req, start, count, tokens))
        rows.append(hidden_of(target, tokens)[start:start + count])
    proposer.on_features(updates, torch.cat(rows))


@pytest.mark.head_kernels  # (the fused kernels against the oracle: tests/conftest.py)
@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_cached_drafts_equal_the_written_out_oracle_across_steps(target, graphs):
    """Prompts of several lengths (one longer than the pending bound: written at once), then
    steps that verify 1-3 positions each, one request skipping a proposal: every proposal equals
    the oracle over the whole context, exact shapes or padded to a graph layout (eagerly)."""
    head = random_head(target.config, seed=2)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    g = torch.Generator().manual_seed(0)
    contexts = {"a": [5, 6, 7], "b": [9, 3], "c": torch.randint(0, VOCAB, (11,), generator=g)
                .tolist()}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    plan = [{"a": 3, "b": 2, "c": 3}, {"a": 2, "c": 1}, {"a": 3, "b": 3, "c": 2},
            {"a": 1, "b": 2, "c": 3}]
    for step, ks in enumerate(plan):
        requests = [ProposeRequest(r, contexts[r], k, SamplingParams(temperature=0))
                    for r, k in ks.items()]
        got = proposer.propose(requests).draft_token_ids
        for req, drafts in zip(ks, got, strict=True):
            want = oracle_drafts(head, embed, lm_head, hidden_of(target, contexts[req])[:-1],
                                 contexts[req], ks[req])
            assert drafts == want, (step, req)
        verified = {}
        for req, tokens in contexts.items():  # accept the first draft or none, then a bonus
            start = len(tokens) - 1
            drafts = dict(zip(ks, got, strict=True)).get(req, [])
            new = drafts[:(step + len(req)) % 2] + [(step * 7 + len(tokens)) % VOCAB]
            tokens.extend(new)
            verified[req] = (start, len(new))
        feed(proposer, target, contexts, verified)
    assert proposer.cache.length["c"] > 0


@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_pending_pairs_wait_for_a_proposal_unless_past_the_lazy_bound(target, graphs):
    """Steps without a proposal write nothing into the head's cache until a request holds more
    than ``max_lazy`` pending pairs (then all but its newest at once); a proposal after such a
    stretch (past the graph layout's room) still equals the oracle over the whole context."""
    head = random_head(target.config, seed=3)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    proposer.max_lazy = 8
    tokens = [5, 6, 7]
    feed(proposer, target, {"a": tokens}, {"a": (0, 2)})

    def plain_steps(n: int) -> None:
        for step in range(n):
            tokens.append((step * 5 + len(tokens)) % VOCAB)
            feed(proposer, target, {"a": tokens}, {"a": (len(tokens) - 2, 1)})

    def check_proposal(k: int) -> None:
        (got,) = proposer.propose([ProposeRequest("a", tokens, k, SamplingParams(
            temperature=0))]).draft_token_ids
        assert got == oracle_drafts(head, embed, lm_head, hidden_of(target, tokens)[:-1],
                                    tokens, k)

    plain_steps(6)  # 8 pending pairs: at the bound, none written
    assert proposer.cache.length["a"] == 0 and len(proposer._pending["a"].tokens) == 8
    check_proposal(3)
    assert proposer.cache.length["a"] == len(tokens) - 1  # (the proposal wrote them)
    plain_steps(9)  # the 9th pending pair passes the bound: 8 written, the newest waits
    assert proposer.cache.length["a"] == len(tokens) - 2
    assert len(proposer._pending["a"].tokens) == 1
    plain_steps(3)
    check_proposal(2)


@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_lazy_writes_of_several_requests_keep_each_requests_rows_in_order(target, graphs):
    """Two requests whose steps verify 1-3 positions each (several pending segments a request,
    interleaved in each step's features) written together past the lazy bound: every
    proposal after equals the oracle over the whole context."""
    head = random_head(target.config, seed=7)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    proposer.max_lazy = 6
    contexts = {"a": [5, 6, 7], "b": [9, 8, 7, 6]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    for step in range(4):  # plain steps that verify 1-3 positions
        verified = {}
        for req, tokens in contexts.items():
            new = [(step * 5 + len(tokens) + i) % VOCAB for i in range(1 + (step + len(req)) % 3)]
            verified[req] = (len(tokens) - 1, len(new))
            tokens.extend(new)
        feed(proposer, target, contexts, verified)
    assert all(proposer.cache.length[r] > 0 for r in contexts)  # (written past the bound)
    got = proposer.propose([ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                            for r, t in contexts.items()]).draft_token_ids
    for (req, tokens), drafts in zip(contexts.items(), got, strict=True):
        assert drafts == oracle_drafts(head, embed, lm_head, hidden_of(target, tokens)[:-1],
                                       tokens, 3), req


def test_observing_a_plain_step_writes_the_pairs_that_fill_a_graphs_room(target):
    """On a GPU the engine shows the proposer each step without drafts while its forward runs:
    a request holding ``max_pending`` pending pairs has all but the newest written then (a
    request with fewer keeps them), and its next proposal, after the step's own pair, finds
    no more than the graph's layout holds and equals the oracle."""
    head = random_head(target.config, seed=6)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=True)  # max_pending 4
    contexts = {"a": [5, 6, 7, 8, 9], "b": [4, 3]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    requests = [ProposeRequest(r, t, 0, SamplingParams(temperature=0))
                for r, t in contexts.items()]
    proposer.observe(requests)
    assert proposer.cache.length == {"a": 3, "b": 0}  # "a" held 4 pairs, "b" 1
    assert [len(proposer._pending[r].tokens) for r in "ab"] == [1, 1]
    for tokens in contexts.values():
        tokens.append(11)
    feed(proposer, target, contexts, {r: (len(t) - 2, 1) for r, t in contexts.items()})
    got = proposer.propose([ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                            for r, t in contexts.items()]).draft_token_ids
    for (req, tokens), drafts in zip(contexts.items(), got, strict=True):
        assert drafts == oracle_drafts(head, embed, lm_head, hidden_of(target, tokens)[:-1],
                                       tokens, 3), req


def test_a_gap_in_the_features_stops_drafts_until_the_request_is_removed(target):
    proposer = make_proposer(target, random_head(target.config))
    tokens = [5, 6, 7, 8]
    feed(proposer, target, {"a": tokens}, {"a": (1, 2)})  # not from position 0
    request = ProposeRequest("a", tokens, 2, SamplingParams(temperature=0))
    assert proposer.propose([request]).draft_token_ids == [[]]
    proposer.remove("a")
    feed(proposer, target, {"a": tokens}, {"a": (0, 3)})
    assert len(proposer.propose([request]).draft_token_ids[0]) == 2
    proposer.remove("a")
    assert "a" not in proposer.cache.slot_of and not proposer._pending


def cuda_head_proposers(head_seed: int, max_tokens: int):
    """A 2-layer tiny target on the GPU, and ``make(graphs)``: a draft-head proposer of a
    random head on it (4 slots, ``max_tokens`` tokens, k = 4), with or without CUDA graphs."""
    model = copy.deepcopy(tiny_model("llama", vocab_size=VOCAB, num_layers=2, seed=3)).cuda()
    head = random_head(model.config, seed=head_seed).cuda()
    return model, lambda graphs: DraftHeadProposer(
        head, model.get_input_embeddings(), model.get_output_embeddings(), VOCAB, 4,
        max_tokens, 4, graphs=graphs)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_the_proposal_replays_cuda_graphs_that_match_the_eager_proposal():
    model, make = cuda_head_proposers(head_seed=5, max_tokens=64)
    eager, graphed = make(False), make(True)
    contexts = {r: [3 + i, 9, 4 + i] for i, r in enumerate("abc")}
    for step in range(5):
        updates, rows = [], []
        for req, tokens in contexts.items():
            start = 0 if step == 0 else len(tokens) - 2
            updates.append(FeatureUpdate(req, start, len(tokens) - 1 - start, tokens))
            with torch.no_grad():
                rows.append(model(input_ids=torch.tensor([tokens], device="cuda"),
                                  output_hidden_states=True).hidden_states[-1][0][start:-1])
        requests = [ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                    for r, t in contexts.items()]
        for p in (eager, graphed):
            p.on_features(updates, torch.cat(rows))
        got = graphed.propose(requests).draft_token_ids
        assert got == eager.propose(requests).draft_token_ids
        for tokens, drafts in zip(contexts.values(), got, strict=True):
            tokens.append(drafts[0] if step % 2 else (tokens[-1] + 1) % VOCAB)
    assert graphed.graphs.num_graphs >= 1 and graphed.graphs.num_replays >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="pinned copies and CUDA graphs need a "
                    "CUDA device")
def test_on_a_gpu_plain_steps_observed_behind_a_forward_keep_proposals_exact():
    """The GPU path of the lazy writes: plain steps shown to ``observe`` while the GPU is busy
    (a queued spin kernel standing in for the target's forward; the index columns go through
    the pinned buffer), then graph-replayed proposals after 1-6 plain steps. Each equals the
    proposals of an eager proposer that was never shown the plain steps (it writes every
    pending pair in its proposal), and the queued work does not hold ``observe`` back."""
    model, make = cuda_head_proposers(head_seed=9, max_tokens=96)
    observed, eager = make(True), make(False)
    contexts = {r: [3 + i, 9, 4 + i] for i, r in enumerate("ab")}

    def feed_both(count: int) -> None:  # the last ``count`` positions before the newest token
        updates, rows = [], []
        for req, tokens in contexts.items():
            start = len(tokens) - 1 - count
            updates.append(FeatureUpdate(req, start, count, tokens))
            with torch.no_grad():
                rows.append(model(input_ids=torch.tensor([tokens], device="cuda"),
                                  output_hidden_states=True).hidden_states[-1][0][start:-1])
        for p in (observed, eager):
            p.on_features(updates, torch.cat(rows))

    feed_both(2)
    for round_, gap in enumerate([1, 4, 6, 2]):
        for _ in range(gap):  # plain steps
            torch.cuda._sleep(50_000_000)  # (tens of ms of GPU work queued)
            queued = torch.cuda.Event()
            queued.record()
            observed.observe([ProposeRequest(r, t, 0, SamplingParams(temperature=0))
                              for r, t in contexts.items()])
            assert not queued.query()  # (observe returned while the GPU was still busy)
            for tokens in contexts.values():
                tokens.append((len(tokens) * 7 + round_) % VOCAB)
            feed_both(1)
        requests = [ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                    for r, t in contexts.items()]
        got = observed.propose(requests).draft_token_ids
        assert got == eager.propose(requests).draft_token_ids, round_
        for tokens, drafts in zip(contexts.values(), got, strict=True):
            tokens.append(drafts[0])
        feed_both(1)
    assert observed.graphs.num_replays >= 1
    assert all(observed.cache.length[r] > 0 for r in contexts)


def make_llm(target, head_dir, **kwargs) -> LLM:
    spec = {"method": "eagle", "model": str(head_dir), "num_speculative_tokens": 3,
            **kwargs.pop("spec", {})}
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
               speculative_config=spec, **kwargs)


def test_the_engine_writes_every_verified_position_into_the_heads_cache(target, head_dir):
    """After each step the head's committed keys are those of the pairs (``f_j``, ``x_{j+1}``)
    that Hugging Face's hidden states give, at every position so far: a chain's drafts write
    their pairs past the newest one (they do, here), and the verified pairs replace them there
    (that no proposal reads a draft's pair first is what the oracle tests above check)."""
    llm = make_llm(target, head_dir, spec={"adaptive_k": False})
    engine, proposer = llm.engine, llm.engine.proposer
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    engine.add_request("r", None, [5, 17, 3, 60, 22], params)
    (seq,) = engine.requests["r"]
    drafts_seen = False
    for _ in range(4):
        engine.step()
        tokens = seq.all_token_ids
        hidden = hidden_of(target, tokens)
        n = proposer.cache.length[seq.seq_id] + len(proposer._pending[seq.seq_id].tokens)
        assert n == len(tokens) - 1  # every position before the newest token
        committed = proposer.cache.length[seq.seq_id]
        with torch.no_grad():
            x = proposer.head.inputs(hidden[:committed], target.get_input_embeddings()(
                torch.tensor(tokens[1:committed + 1], dtype=torch.long)))
            keys, _ = proposer.head.keys_values(x, torch.arange(committed))
        slot = proposer.cache.slot_of[seq.seq_id]
        torch.testing.assert_close(proposer.cache.keys[slot, :committed], keys,
                                   atol=1e-4, rtol=1e-4)
        drafts_seen |= bool(proposer.cache.keys[slot, committed:].any())
    assert llm.get_metrics().num_drafted > 0  # (proposals ran: their drafts had pairs)
    assert drafts_seen  # (past the committed pairs: later overwritten, checked above)


@pytest.mark.head_kernels  # (the engine end to end through the fused kernels: tests/conftest.py)
@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_output_with_the_draft_head_equals_hugging_face(target, head_dir, batch):
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32, 33, 30, 31], [40]][:batch]
    llm = make_llm(target, head_dir, spec={"adaptive_k": False})  # every step verifies 3
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 16)
    metrics = llm.get_metrics()  # (prompt 0 repeats one token: all its drafts pass)
    assert 0 < metrics.num_accepted <= metrics.num_drafted
    assert batch == 1 or metrics.num_accepted < metrics.num_drafted


def test_chunked_prefill_and_preemption_keep_greedy_output_and_free_the_head(target, head_dir):
    """Prompts longer than a step's token budget arrive in chunks (each chunk's features are
    handed over); a KV cache too small for all of them preempts and recomputes."""
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in (21, 17, 9)]
    llm = make_llm(target, head_dir, spec={"adaptive_k": False},
                   max_num_batched_tokens=8, kv_cache_tokens=56)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 14)
    metrics = llm.get_metrics()
    assert metrics.num_preemptions > 0 and 0 < metrics.num_accepted < metrics.num_drafted
    proposer = llm.engine.proposer
    assert not proposer.cache.slot_of and not proposer._pending and not proposer._broken


def test_staggered_arrivals_and_a_seeded_sample_repeat(target, head_dir):
    llm = make_llm(target, head_dir)
    greedy = SamplingParams(temperature=0, max_tokens=10, ignore_eos=True)
    stream = llm.generate_stream([[5, 17, 3]], greedy)
    first = next(stream)  # the first request runs a step before the second arrives
    late = llm.generate([[8, 8, 9]], greedy, use_tqdm=False)[0]
    rest = [first] + list(stream)
    assert late.outputs[0].token_ids == hf_greedy(target, [8, 8, 9], 10)
    assert rest[-1].finish_reason == "length"
    seeded = SamplingParams(temperature=1.0, seed=11, max_tokens=10, ignore_eos=True)
    a = llm.generate([[5, 6]], seeded, use_tqdm=False)[0].outputs[0].token_ids
    b = llm.generate([[5, 6]], seeded, use_tqdm=False)[0].outputs[0].token_ids
    assert a == b and len(a) == 10


def test_ngram_or_head_drafts_from_a_match_else_from_the_head_and_stays_lossless(target,
                                                                                  head_dir):
    """Method ``ngram_eagle``: a request whose suffix repeats gets n-gram's drafts, one without
    a match the head's; greedy output equals Hugging Face's either way."""
    from proposers.ngram_or_head import MIN_MATCH

    llm = make_llm(target, head_dir, spec={"method": "ngram_eagle", "adaptive_k": False})
    proposer = llm.engine.proposer
    calls = {"ngram": 0, "head": 0}
    for name, part in (("ngram", proposer.ngram), ("head", proposer.head)):
        original = part.propose

        def counted(requests, original=original, name=name):
            calls[name] += len(requests)
            return original(requests)
        part.propose = counted
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [30, 41, 52, 63, 74]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 16)
    # every request is looked up; the head is asked only for those without a long match
    assert calls["ngram"] > calls["head"] > 0
    requests = [ProposeRequest("x", [5, 6, 7, 5, 6, 7, 5, 6], 3, SamplingParams(temperature=0))]
    proposal = proposer.propose(requests)
    assert proposal.num_backed[0] >= MIN_MATCH and proposal.draft_token_ids == [[7, 5, 6]]


def test_one_graph_layout_serves_every_number_of_drafts(target):
    """The graph path drafts the configured k whatever a step asks (the last steps of a batch
    ask fewer, as caps shrink near max_tokens), so proposals of 3, 1 and 2 drafts share one
    layout (a new one would run eager, then be captured); each request gets the drafts it asked
    for, equal to the eager proposer's."""
    head = random_head(target.config, seed=4)
    graphed, eager = make_proposer(target, head, graphs=True), make_proposer(target, head)
    tokens = [5, 6, 7]
    for p in (graphed, eager):
        feed(p, target, {"a": tokens}, {"a": (0, 2)})
    for step, k in enumerate([3, 1, 2, 3, 1]):
        request = [ProposeRequest("a", tokens, k, SamplingParams(temperature=0))]
        (got,) = graphed.propose(request).draft_token_ids
        assert len(got) == k and [got] == eager.propose(request).draft_token_ids, step
        tokens.append((step * 3 + 8) % VOCAB)
        for p in (graphed, eager):
            feed(p, target, {"a": tokens}, {"a": (len(tokens) - 2, 1)})
    assert graphed.graphs.num_graphs == 1


def test_capturing_a_batch_bucket_captures_the_smaller_ones(target):
    """A batch shrinks as its requests finish: when a chain layout is captured, every smaller
    batch bucket's is too (on padding rows), so a later proposal for fewer requests replays at
    once, and equals the eager proposer's."""
    head = random_head(target.config, seed=8)
    graphed, eager = make_proposer(target, head, graphs=True), make_proposer(target, head)
    contexts = {r: [3 + i, 9, 4 + i, 7] for i, r in enumerate("abc")}  # batch bucket 4
    for p in (graphed, eager):
        feed(p, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    for step in range(3):
        live = dict(list(contexts.items())[:1 if step == 2 else 3])  # the last step: 1 left
        requests = [ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                    for r, t in live.items()]
        got = graphed.propose(requests).draft_token_ids
        assert got == eager.propose(requests).draft_token_ids, step
        if step == 1:  # (the bucket's second meeting captured it, and the smaller ones)
            assert graphed.graphs.num_graphs == 3
        if step == 2:
            assert graphed.last_proposal_steady  # (bucket 1 met for the first time: replayed)
        for req, tokens in live.items():
            tokens.append((step + len(req)) % VOCAB)
        for p in (graphed, eager):
            feed(p, target, live, {r: (len(t) - 2, 1) for r, t in live.items()})


def test_a_proposal_that_captures_or_moves_the_cache_is_not_steady(target):
    """The controller learns costs only from proposals timed like the ones after them: a graph
    layout's first two meetings (eager, then capture) and a proposal that grew the head's cache
    are not steady; replays are."""
    proposer = make_proposer(target, random_head(target.config), graphs=True)
    tokens = [5, 6, 7]
    feed(proposer, target, {"a": tokens}, {"a": (0, 2)})
    steady = []
    for step in range(4):
        steady.append(proposer.propose([ProposeRequest("a", tokens, 2, SamplingParams(
            temperature=0))]).draft_token_ids and proposer.last_proposal_steady)
        tokens.append((step * 5 + 3) % VOCAB)
        feed(proposer, target, {"a": tokens}, {"a": (len(tokens) - 2, 1)})
    assert steady == [False, False, True, True]
    # past the cache's capacity the tensors move: graphs dropped, the proposal not steady
    long = tokens + [4] * (proposer.cache.capacity - len(tokens) + 1)
    feed(proposer, target, {"a": long}, {"a": (len(tokens) - 1, len(long) - len(tokens))})
    proposer.propose([ProposeRequest("a", long, 2, SamplingParams(temperature=0))])
    assert not proposer.last_proposal_steady and proposer.graphs.num_graphs == 0


def test_a_draft_vocabulary_is_saved_with_the_head_and_checked(tmp_path, target):
    head = random_head(target.config, seed=1)
    head.set_vocab([7, 3, 40])
    head.save(tmp_path / "h")
    assert json.loads((tmp_path / "h" / "draft_head.json").read_text())["draft_vocab_size"] == 3
    assert DraftHead.load(tmp_path / "h").vocab.tolist() == [7, 3, 40]
    for bad in ([], [3, 3], [-1, 2]):
        with pytest.raises(ValueError, match="draft vocabulary"):
            head.set_vocab(bad)
    head.set_vocab([VOCAB + 5])
    with pytest.raises(ValueError, match=f"token id {VOCAB + 5}"):
        make_proposer(target, head)


@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_a_draft_vocabulary_reads_out_its_rows_only_and_maps_back_to_token_ids(target, graphs):
    """With every token in a shuffled order the drafts are the full head's; with a part, each
    draft is the best token of that part (the written-out oracle over its rows)."""
    head = random_head(target.config, seed=4)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    contexts = {"a": [5, 6, 7, 9, 11], "b": [9, 3, 4]}
    full = make_proposer(target, head, graphs=graphs)
    feed(full, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    requests = [ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                for r, t in contexts.items()]
    want = full.propose(requests).draft_token_ids
    perm = torch.randperm(VOCAB, generator=torch.Generator().manual_seed(0)).tolist()
    part = perm[:VOCAB // 3]
    for vocab in (perm, part):
        restricted = copy.deepcopy(head)
        restricted.set_vocab(vocab)
        proposer = make_proposer(target, restricted, graphs=graphs)
        feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
        got = proposer.propose(requests).draft_token_ids
        if vocab is perm:
            assert got == want
            continue
        rows = torch.tensor(part)

        def part_head(feature, rows=rows):  # the full head's logits at the part's ids only
            return torch.full((VOCAB,), -torch.inf).index_copy(0, rows, lm_head(feature)[rows])

        for req, drafts in zip(contexts, got, strict=True):
            assert set(drafts) <= set(part)
            assert drafts == oracle_drafts(head, embed, part_head,
                                           hidden_of(target, contexts[req])[:-1],
                                           contexts[req], 3)


def test_greedy_output_with_a_draft_vocabulary_equals_hugging_face(tmp_path, target, head_dir):
    head = DraftHead.load(head_dir)
    head.set_vocab(list(range(0, VOCAB, 2)))  # half the tokens: many drafts cannot be right
    head.save(tmp_path / "half")
    llm = make_llm(target, tmp_path / "half", spec={"adaptive_k": False})
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32, 33, 30, 31]]
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    for prompt, out in zip(prompts, llm.generate(prompts, params, use_tqdm=False), strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 16)
    assert llm.get_metrics().num_drafted > 0


def test_the_head_captures_graphs_only_beside_the_targets_embeddings_and_head():
    """A target spread over devices or offloaded by accelerate moves tensors between devices in
    its embedding's or head's forward, which a CUDA graph capture refuses: the head then drafts
    eagerly (``load`` passes ``graphs=False``)."""
    head = torch.nn.Linear(4, 4)
    assert beside(head, torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8))
    assert not beside(head, torch.nn.Embedding(8, 4), torch.nn.Linear(4, 8, device="meta"))


def staggered_drafts(target, head_dir, method: str, configure=None) -> tuple[int, int]:
    """Five prompts arriving at steps 0, 1, 2, 4 and 5 of an engine of 16 tokens a step (the
    19-token prompt's last chunk, 8 tokens, comes after the first request's verification and
    before the 3-token newcomer's prefill), greedy, ``configure(runner)`` first; every output
    must equal Hugging Face's. Returns the run's drafted and accepted drafts."""
    from engine.llm import build_output

    g = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in (9, 19, 3, 12, 11)]
    arrivals = [0, 1, 2, 4, 5]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    llm = make_llm(target, head_dir, spec={"method": method, "adaptive_k": False},
                   max_num_batched_tokens=16)
    if configure is not None:
        configure(llm.engine.runner)
    engine, step, ids = llm.engine, 0, [f"r{i}" for i in range(len(prompts))]
    while step <= max(arrivals) or engine.has_work():
        for rid, prompt, at in zip(ids, prompts, arrivals, strict=True):
            if at == step:
                engine.add_request(rid, None, prompt, params)
        engine.step()
        step += 1
    for rid, prompt in zip(ids, prompts, strict=True):
        out = build_output(engine.pop_request(rid)).outputs[0].token_ids
        assert list(out) == hf_greedy(target, prompt, 12)
    metrics = llm.get_metrics()
    return metrics.num_drafted, metrics.num_accepted


@pytest.mark.parametrize("method", ["eagle", "ngram_eagle"])
def test_steps_split_around_admitted_prompts_keep_greedy_output(target, head_dir, monkeypatch,
                                                                 method):
    """Prompts admitted while others verify drafts: the runner splits those steps in two
    forwards (here at any saving), one of them with a prompt chunk between two short rows.
    Greedy output equals Hugging Face's, and the run drafts and accepts as many drafts as
    without the split (the features' order itself: the runner's tests, which compare the
    hidden states row by row)."""
    from engine.runner import step_layout
    from engine.runner.model_runner import ModelRunner

    monkeypatch.setattr(step_layout, "SPLIT_SHORT", 5)  # (k + 1 = 5: drafts stay short)
    splits = []
    forward_split = ModelRunner._forward_split
    monkeypatch.setattr(ModelRunner, "_forward_split", lambda self, plan, *a: (
        splits.append(plan.groups), forward_split(self, plan, *a))[1])
    counts = []
    for min_saved in (1, 10**9):  # split at any saving, then never
        monkeypatch.setattr(step_layout, "SPLIT_MIN_SAVED", min_saved)
        counts.append((*staggered_drafts(target, head_dir, method), len(splits)))
    assert counts[0][2] > 0 and counts[1][2] == counts[0][2]  # split steps: the first run's
    # (at least one split put a long row before a short one back in place)
    assert any(max(short) > min(long) for short, long in splits)
    assert counts[0][:2] == counts[1][:2] and counts[0][1] > 0


@pytest.mark.parametrize("method", ["eagle", "ngram_eagle"])
def test_steps_folded_around_admitted_prompts_keep_greedy_output(target, head_dir, monkeypatch,
                                                                  method):
    """With graph buckets (their padded layout, eagerly here) a prompt admitted while others
    verify drafts is folded into the step: its chunk cut into rows of the step's width, one
    forward. Greedy output equals Hugging Face's, and the run drafts and accepts as many drafts
    as a runner that neither folds nor splits (the head reads every token's features back in
    step order)."""
    from engine.runner import model_runner

    folds = []
    cut_rows = model_runner.cut_rows
    monkeypatch.setattr(model_runner, "cut_rows", lambda width, *a: (
        folds.append(width), cut_rows(width, *a))[1])
    counts = []
    for fold in (True, False):
        def graphs(runner, fold=fold) -> None:
            runner.use_graph_buckets(4, capture=False)  # (k + 1 = 4)
            runner.fold_mixed, runner.split_mixed = fold, False

        counts.append((*staggered_drafts(target, head_dir, method, graphs), len(folds)))
    assert counts[0][2] >= 2 and counts[1][2] == counts[0][2]  # folded steps: the first run's
    assert counts[0][:2] == counts[1][:2] and counts[0][1] > 0


@pytest.mark.head_kernels  # (the fused kernels against the oracle: tests/conftest.py)
@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_drafts_from_a_verification_on_the_device_equal_the_written_out_oracle(target, graphs):
    """Overlapped drafting steps (``draft_after``, then ``advance`` when the step is read):
    each step verifies its fed token and k drafts, accepting 0 to k of them, and the next
    drafts come from the step's own features on the device: every chain equals the oracle over
    the whole context, and a proposal from the host after them (the flights stopped) too."""
    head = random_head(target.config, seed=4)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    k = 3
    contexts = {"a": [5, 6, 7, 8], "b": [9, 3], "c": [4, 4, 1, 2, 7, 7, 30]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    requests = [ProposeRequest(r, t, k, SamplingParams(temperature=0))
                for r, t in contexts.items()]
    drafts = proposer.propose(requests).draft_token_ids
    g = torch.Generator().manual_seed(1)
    for step in range(5):
        req_ids = list(contexts)
        accepted = torch.randint(0, k + 1, (3,), generator=g)
        accepted[step % 3] = k if step % 2 else 0  # (every request sees both ends)
        base = [len(contexts[r]) - 1 for r in req_ids]
        rows, tokens = [], []
        for r, d, a in zip(req_ids, drafts, accepted.tolist(), strict=True):
            rows.append(hidden_of(target, contexts[r] + d)[-(k + 1):])  # the step's features
            bonus = (step * 11 + len(contexts[r])) % VOCAB
            tokens.append(d[:a] + [bonus] + [-1] * (k - a))
        got = proposer.draft_after(req_ids, torch.cat(rows), torch.tensor(tokens), accepted,
                                   torch.tensor(base), base, k).tolist()
        for r, row, a in zip(req_ids, tokens, accepted.tolist(), strict=True):
            contexts[r] += row[:a + 1]
        for r, chain, a, step_rows in zip(req_ids, got, accepted.tolist(), rows, strict=True):
            want = oracle_drafts(head, embed, lm_head, hidden_of(target, contexts[r])[:-1],
                                 contexts[r], k)
            assert chain == want, (step, r)
            proposer.advance(r, len(contexts[r]) - 1, step_rows, a, contexts[r][-1])
        drafts = got
    # the flights stop: a proposal from the host continues from what advance() left
    proposal = proposer.propose([ProposeRequest(r, t, k, SamplingParams(temperature=0))
                                 for r, t in contexts.items()]).draft_token_ids
    for r, chain in zip(contexts, proposal, strict=True):
        assert chain == oracle_drafts(head, embed, lm_head, hidden_of(target, contexts[r])[:-1],
                                      contexts[r], k), r


@pytest.mark.head_kernels  # (the fused kernels against the oracle: tests/conftest.py)
@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_drafts_after_a_verification_in_the_heads_graph_equal_the_written_out_oracle(target,
                                                                                    graphs):
    """``verify_and_draft``: greedy acceptance from the target's argmax
    (``accept_chains``) runs with the head's chain (in its graph where it has one). Each
    step verifies the first 1-3 of its chains' 3 drafts (a graph a width); its outputs equal
    the verification run alone, and the next chains equal the oracle over the whole context.
    A request leaves after the second step, so the padded layout's last row holds its stale
    inputs from then on: nothing of it reaches the others."""
    head = random_head(target.config, seed=6)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    k = 3
    contexts = {"a": [5, 6, 7, 8], "b": [9, 3], "c": [4, 4, 1, 2, 7, 7, 30], "d": [11, 12, 13]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    drafts = proposer.propose([ProposeRequest(r, t, k, SamplingParams(temperature=0))
                               for r, t in contexts.items()]).draft_token_ids
    verify = partial(accept_chains, vocab_size=VOCAB)
    g = torch.Generator().manual_seed(2)
    before = None  # (the step before's outputs and copies of them: a flight reads them later)
    for step in range(5):
        if step == 2:
            proposer.remove("d")
            del contexts["d"]
            drafts = drafts[:3]
        req_ids = list(contexts)
        n = [3, 1, 2, 3, 2][step]  # (the drafts this step verifies)
        drafts = [d[:n] for d in drafts]
        want_accepted = torch.randint(0, n + 1, (len(req_ids),), generator=g)
        want_accepted[step % len(req_ids)] = n if step % 2 else 0  # (both ends)
        rows, argmax = [], []
        for r, d, a in zip(req_ids, drafts, want_accepted.tolist(), strict=True):
            rows.append(hidden_of(target, contexts[r] + d)[-(n + 1):])  # the step's features
            bonus = (step * 11 + len(contexts[r])) % VOCAB
            differs = (d[a] + 1) % VOCAB if a < n else bonus  # (rejects draft a)
            argmax += d[:a] + [differs] + [(bonus + j) % VOCAB for j in range(n - a)]
        base = [len(contexts[r]) - 1 for r in req_ids]
        inputs = (torch.tensor(argmax), torch.tensor(drafts), torch.tensor(base))
        outs, got = proposer.verify_and_draft(req_ids, torch.cat(rows), verify, inputs,
                                              inputs[2], base, k)
        alone = verify(*inputs)
        if before is not None:  # (not views of what the graph's next run overwrote)
            assert all(torch.equal(x, y) for x, y in zip(*before, strict=True))
        before = ([*outs, got], [t.clone() for t in [*outs, got]])
        assert len(outs) == len(alone)
        for out, want in zip(outs, alone, strict=True):
            assert out.shape == want.shape and torch.equal(out, want), step
        tokens, accepted = outs[0].tolist(), outs[1].tolist()
        assert accepted == want_accepted.tolist()
        for r, row, a in zip(req_ids, tokens, accepted, strict=True):
            contexts[r] += row[:a + 1]
        for r, chain, a, step_rows in zip(req_ids, got.tolist(), accepted, rows, strict=True):
            want = oracle_drafts(head, embed, lm_head, hidden_of(target, contexts[r])[:-1],
                                 contexts[r], k)
            assert chain == want, (step, r)
            proposer.advance(r, len(contexts[r]) - 1, step_rows, a, contexts[r][-1])
        drafts = got.tolist()


def plain_step_on_device(proposer, target, contexts: dict, req_ids: list, salt: int) -> None:
    """An overlapped plain step of ``req_ids``: each fed its newest token and sampled another
    (a token from ``salt``); the pairs go in on the device (``write_after``), then the step is
    read (``advance``) and the tokens join ``contexts``."""
    features = torch.cat([hidden_of(target, contexts[r])[-1:] for r in req_ids])
    sampled = [(salt + len(contexts[r])) % VOCAB for r in req_ids]
    proposer.write_after(req_ids, features, torch.tensor(sampled),
                         [len(contexts[r]) - 1 for r in req_ids])
    for row, (r, token) in enumerate(zip(req_ids, sampled, strict=True)):
        contexts[r].append(token)
        proposer.advance(r, len(contexts[r]) - 1, features, row, token)


@pytest.mark.head_kernels  # (the fused kernels against the oracle: tests/conftest.py)
@pytest.mark.parametrize("defer_steps", [1, 3, DEFER_STEPS],
                         ids=["each-step", "held-3-steps", "held-to-the-read"])
@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_pairs_of_plain_steps_written_on_the_device_equal_the_written_out_oracle(
        target, graphs, defer_steps):
    """Plain steps that keep their pairs on the device (``write_after``, then ``advance`` when
    the step is read), the first after pairs still pending on the host, some steps for a part
    of the batch, one request's last pair handed on the host: chains drafted on the device
    after them (``flush``, then ``draft_after``), and a proposal from the host, equal the
    oracle over the whole context; the pairs written at each step, every ``defer_steps``
    steps (a full hold: 7 steps), or all at the cache's next read."""
    head = random_head(target.config, seed=6)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs, defer_steps=defer_steps)
    k = 3
    contexts = {"a": [5, 6, 7, 8, 2], "b": [9, 3], "c": [4, 4, 1, 2, 7, 7, 30]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    for step in range(7):
        req_ids = list(contexts) if step % 3 else ["c", "a"]  # (a part of the batch, reordered)
        assert all(proposer.ready_on_device(r, len(contexts[r])) for r in req_ids)
        plain_step_on_device(proposer, target, contexts, req_ids, step * 7)
    # one plain step whose features come from the host for "b" (pending there, not written)
    contexts["b"].append(17)
    feed(proposer, target, contexts, {"b": (len(contexts["b"]) - 2, 1)})
    # a drafting step after them, on the device (nothing accepted: each fed token's bonus)
    req_ids = list(contexts)
    base = [len(contexts[r]) - 1 for r in req_ids]
    rows = torch.cat([hidden_of(target, contexts[r])[-1:] for r in req_ids])
    bonus = [[(3 * len(contexts[r])) % VOCAB] for r in req_ids]
    proposer.flush(req_ids, [contexts[r] for r in req_ids])
    got = proposer.draft_after(req_ids, rows, torch.tensor(bonus), torch.zeros(3, dtype=torch.long),
                               torch.tensor(base), base, k).tolist()
    for r, chain, b in zip(req_ids, got, bonus, strict=True):
        want = oracle_drafts(head, embed, lm_head, hidden_of(target, contexts[r] + b)[:-1],
                             contexts[r] + b, k)
        assert chain == want, r
    # every pair's keys and values are those of the same pairs written from the host
    written = make_proposer(target, head)
    full = {r: contexts[r] + b for r, b in zip(req_ids, bonus, strict=True)}
    feed(written, target, full, {r: (0, len(t) - 1) for r, t in full.items()})
    written.flush(req_ids, list(full.values()))
    for r in req_ids:
        n = len(full[r]) - 1
        for mine, theirs in ((proposer.cache.keys, written.cache.keys),
                             (proposer.cache.values, written.cache.values)):
            torch.testing.assert_close(mine[proposer.cache.slot_of[r], :n],
                                       theirs[written.cache.slot_of[r], :n])
    # and from the host, a fresh proposer state's way: every pending pair of the plain steps
    proposer = make_proposer(target, head, graphs=graphs, defer_steps=defer_steps)
    contexts = {"a": [5, 6, 7, 8, 2, 11, 12], "b": [9, 3, 40]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    for step in range(5):
        plain_step_on_device(proposer, target, contexts, list(contexts), step * 5)
    proposal = proposer.propose([ProposeRequest(r, t, k, SamplingParams(temperature=0))
                                 for r, t in contexts.items()]).draft_token_ids
    for r, chain in zip(contexts, proposal, strict=True):
        assert chain == oracle_drafts(head, embed, lm_head, hidden_of(target, contexts[r])[:-1],
                                      contexts[r], k), r


@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_held_pairs_of_a_request_that_left_do_not_reach_the_next_one_in_its_slot(target, graphs):
    """A request's plain-step pairs wait on the device (``write_after``); it leaves before they
    are written, and a new request takes its slot: the new request's drafts are the oracle's
    over its own context, in its first proposal (after a plain step that wrote its pending
    pairs from the host, ``observe``) and after a plain step held on the device (the held
    pairs, at positions the new one fills, go in before anything of the new one's)."""
    head = random_head(target.config, seed=8)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    contexts = {"a": [5, 6, 7, 8, 2], "b": [9, 3, 4]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    for step in range(4):
        plain_step_on_device(proposer, target, contexts, list(contexts), step * 11)
    slot = proposer.cache.slot_of["a"]
    proposer.remove("a")
    fresh = {"d": [31, 2, 17, 9, 40, 3, 22, 8, 1, 5]}  # (positions 4 .. 7 were a's held ones)
    feed(proposer, target, fresh, {"d": (0, len(fresh["d"]) - 1)})
    assert proposer.cache.slot_of["d"] == slot
    k = 3
    for step in range(2):  # (a proposal, then a plain step held on the device and another)
        request = ProposeRequest("d", fresh["d"], k, SamplingParams(temperature=0))
        if step == 0:  # (a plain step from the host first: its pairs written from there)
            proposer.observe([request])
        proposal = proposer.propose([request]).draft_token_ids
        assert proposal[0] == oracle_drafts(head, embed, lm_head,
                                            hidden_of(target, fresh["d"])[:-1], fresh["d"], k)
        plain_step_on_device(proposer, target, fresh, ["d"], 13 + step)


def test_a_proposal_whose_held_pairs_meet_a_new_layout_is_not_steady(target):
    """The proposal writes the plain steps' held pairs first: when that write's layout runs
    eager (its first meeting) or is captured (its second), the proposal's time is not a steady
    one (``last_proposal_steady``), though its own layout replays; the third is."""
    head = random_head(target.config, seed=9)
    proposer = make_proposer(target, head, graphs=True)
    contexts = {"a": [5, 6, 7, 8, 2], "b": [9, 3, 4]}
    feed(proposer, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})

    def proposal() -> bool:
        proposer.propose([ProposeRequest(r, t, 3, SamplingParams(temperature=0))
                          for r, t in contexts.items()])
        return proposer.last_proposal_steady

    steady = []
    for step in range(3):  # (the proposal's own layout: eager, captured, replayed)
        for r in contexts:
            contexts[r].append(step + 11)
        feed(proposer, target, contexts, {r: (len(t) - 2, 1) for r, t in contexts.items()})
        steady.append(proposal())
    for step in range(3):  # (a plain step's pairs held, then a proposal)
        plain_step_on_device(proposer, target, contexts, list(contexts), step * 5)
        steady.append(proposal())
    assert steady == [False, False, True, False, False, True]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_head_graphs_capture_again_after_they_were_cleared():
    """The head's cache grew (its graphs read the old tensors): they are dropped, and the next
    capture goes into a fresh memory pool (the old one is released with its last graph)."""
    from samplers.keyed_graphs import KeyedGraphs

    graphs = KeyedGraphs(torch.device("cuda"))
    x = torch.arange(4.0, device="cuda")
    for _ in range(2):
        for _ in range(3):  # (eager, then captured, then replayed)
            assert torch.equal(graphs.run("k", lambda t: t * 2, [x]), x * 2)
        assert graphs.num_graphs == 1
        graphs.clear()
