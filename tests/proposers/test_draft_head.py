"""The draft head (method ``eagle``): its weights' round trip, its chained drafts, the features
the engine hands it, and greedy output equal to Hugging Face's with it on."""

from __future__ import annotations

import copy

import pytest
import torch

from engine import LLM, SamplingParams
from proposers.base import ProposeRequest
from proposers.draft_head import DraftHead, DraftHeadProposer
from tests.conftest import tiny_model
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer

VOCAB = 96


def random_head(hidden: int, seed: int = 0) -> DraftHead:
    torch.manual_seed(seed)
    head = DraftHead(hidden, 2 * hidden)
    for p in head.parameters():
        torch.nn.init.normal_(p, std=0.2)
    return head.eval()


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, num_layers=2, seed=3)


@pytest.fixture(scope="module")
def head_dir(tmp_path_factory, target):
    directory = tmp_path_factory.mktemp("head")
    random_head(target.config.hidden_size).save(directory, {"trained": "no (a test head)"})
    return directory


def test_a_saved_head_loads_with_the_same_weights_and_a_missing_file_is_named(tmp_path):
    head = random_head(16, seed=1)
    head.save(tmp_path / "h")
    loaded = DraftHead.load(tmp_path / "h")
    f, e = torch.randn(3, 16), torch.randn(3, 16)
    with torch.no_grad():
        torch.testing.assert_close(loaded(f, e), head(f, e), rtol=0, atol=0)
    (tmp_path / "h" / "draft_head.safetensors").unlink()
    with pytest.raises(ValueError, match="draft_head.safetensors"):
        DraftHead.load(tmp_path / "h")


def test_drafts_chain_the_heads_predicted_features_through_the_output_head(target):
    head = random_head(target.config.hidden_size, seed=2)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = DraftHeadProposer(head, embed, lm_head, VOCAB)
    features = torch.randn(2, target.config.hidden_size)
    proposer.on_features(["a", "b"], features)
    requests = [ProposeRequest("a", [5, 6, 7], 3, SamplingParams(temperature=0)),
                ProposeRequest("b", [9], 2, SamplingParams(temperature=0)),
                ProposeRequest("c", [4, 4], 3, SamplingParams(temperature=0))]  # no feature yet
    got = proposer.propose(requests).draft_token_ids
    want = []
    with torch.no_grad():
        for f, last, k in ((features[0], 7, 3), (features[1], 9, 2)):
            drafts, token = [], last
            for _ in range(k):  # written out one sequence, one step at a time
                f = head(f[None], embed(torch.tensor([token])))[0]
                token = int(lm_head(f).argmax())
                drafts.append(token)
            want.append(drafts)
    assert got == want + [[]]
    proposer.remove("a")
    assert proposer.propose(requests[:1]).draft_token_ids == [[]]


def written_out_drafts(head, embed, lm_head, features, last_tokens, steps) -> list[list[int]]:
    """The oracle: each sequence's chain one step at a time, no batching, no padding."""
    want = []
    with torch.no_grad():
        for f, token in zip(features, last_tokens, strict=True):
            drafts = []
            for _ in range(steps):
                f = head(f[None], embed(torch.tensor([token], device=f.device)))[0]
                token = int(lm_head(f).argmax())
                drafts.append(token)
            want.append(drafts)
    return want


@pytest.mark.parametrize("batch, steps", [(1, 1), (3, 2), (5, 3)])
def test_a_bucket_padded_with_zero_rows_drafts_what_the_batch_alone_does(target, batch, steps):
    """Each bucket's layout (batch rounded up to a power of two, padding rows of zero features
    and token 0) run eagerly, as its CUDA graph replays it: the real rows' drafts are unchanged."""
    from proposers.head_graphs import HeadGraphs

    head = random_head(target.config.hidden_size, seed=4)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = DraftHeadProposer(head, embed, lm_head, VOCAB)
    graphs = HeadGraphs(proposer.chain, target.config.hidden_size, torch.float32,
                        torch.device("cpu"), max_batch=8, capture=False)
    features = torch.randn(batch, target.config.hidden_size)
    tokens = torch.randint(0, VOCAB, (batch,))
    want = written_out_drafts(head, embed, lm_head, features, tokens.tolist(), steps)
    with torch.no_grad():
        for _ in range(3):  # first meeting eager, then the bucket's padded layout
            assert graphs.run(features, tokens, steps).tolist() == want
    assert graphs.num_graphs == 1 and graphs.num_replays == 2
    assert graphs.bucket(batch) == {1: 1, 3: 4, 5: 8}[batch]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_the_draft_chain_replays_cuda_graphs_that_match_the_eager_chain(target):
    model = copy.deepcopy(target).cuda()
    head = random_head(model.config.hidden_size, seed=5).cuda()
    proposer = DraftHeadProposer(head, model.get_input_embeddings(),
                                 model.get_output_embeddings(), VOCAB, graphs_max_batch=8)
    assert proposer.graphs is not None
    for batch, steps in [(2, 3), (2, 3), (2, 3), (7, 1), (7, 1), (8, 4), (8, 4)]:
        features = torch.randn(batch, model.config.hidden_size, device="cuda")
        tokens = torch.randint(0, VOCAB, (batch,), device="cuda")
        with torch.inference_mode():
            got = proposer.graphs.run(features, tokens, steps).tolist()
            assert got == proposer.chain(features, tokens, steps).tolist()
    assert proposer.graphs.num_graphs == 3 and proposer.graphs.num_replays == 4


def make_llm(target, head_dir, **spec) -> LLM:
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
               speculative_config={"method": "eagle", "model": str(head_dir),
                                   "num_speculative_tokens": 3, **spec})


def test_the_engine_hands_the_feature_of_the_last_verified_position(target, head_dir):
    llm = make_llm(target, head_dir, adaptive_k=False)
    engine = llm.engine
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    engine.add_request("r", None, [5, 17, 3, 60, 22], params)
    (seq,) = engine.requests["r"]
    for _ in range(3):
        engine.step()
        tokens = seq.all_token_ids
        with torch.inference_mode():
            hidden = target(input_ids=torch.tensor([tokens]),
                            output_hidden_states=True).hidden_states[-1][0]
        # the newest token was sampled from the position before it: that is the feature
        torch.testing.assert_close(engine.proposer._features[seq.seq_id], hidden[-2],
                                   atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("batch", [1, 3])
def test_greedy_output_with_the_draft_head_equals_hugging_face(target, head_dir, batch):
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32, 33, 30, 31], [40]][:batch]
    llm = make_llm(target, head_dir, adaptive_k=False)  # every step verifies 3 drafts
    params = SamplingParams(temperature=0, max_tokens=16, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 16)
    assert llm.get_metrics().num_drafted > 0


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
