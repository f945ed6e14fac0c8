"""EAGLE-3 heads in the speculators format (method ``eagle3``): heads written by hand in the
documented layout load, draft what a plain recomputation of the network drafts from Hugging
Face's layer states, keep greedy output exact, survive export and reload, and bad
directories are refused naming the field."""

from __future__ import annotations

import json

import pytest
import torch

from engine import LLM, SamplingParams
from engine.config import SpeculativeConfig
from proposers.base import FeatureUpdate, ProposeRequest
from proposers.draft_head import DraftHeadProposer
from proposers.speculators import load_eagle3, save_eagle3
from tests.conftest import tiny_model
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer
from tests.proposers.speculators_helpers import reference_drafts, write_eagle3_dir

VOCAB = 96
AUX = [0, 2, 3]
DRAFT_IDS = list(range(95, 0, -2))  # 48 odd target ids, in reverse: d2t offsets are not 0


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, num_layers=4, seed=3)


@pytest.fixture(scope="module")
def head(tmp_path_factory, target):
    """A random head's directory and its weights."""
    directory = tmp_path_factory.mktemp("eagle3")
    return directory, write_eagle3_dir(directory, target.config, DRAFT_IDS, aux=AUX)


def make_llm(target, directory, k: int = 3, **spec) -> LLM:
    config = {"model": str(directory), "num_speculative_tokens": k, "adaptive_k": False, **spec}
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
               speculative_config=config)


def likeliest_chain(drafts: list[int], parents: list[int] | None) -> list[int]:
    """A tree's likeliest chain (each level's first child of the chain's node), or the chain."""
    if parents is None:
        return drafts
    chain, node = [], -1
    while node in parents[node + 1:] or (node == -1 and parents):
        node = parents.index(node, node + 1)
        chain.append(drafts[node])
    return chain


def recorded(proposer) -> list[tuple[list[int], list[int]]]:
    """Every (context, drafts as a chain: a tree's likeliest) the proposer answers from now
    on, and how many were trees."""
    seen = []
    propose = proposer.propose

    def spy(requests):
        out = propose(requests)
        parents = out.parents or [None] * len(requests)
        seen.extend((list(r.token_ids), likeliest_chain(d, p), p is not None)
                    for r, d, p in zip(requests, out.draft_token_ids, parents, strict=True) if d)
        return out

    proposer.propose = spy
    return seen


def test_the_method_is_inferred_from_a_speculators_directory(head):
    assert SpeculativeConfig(model=str(head[0])).method == "eagle3"
    with pytest.raises(ValueError, match="model"):
        SpeculativeConfig(method="eagle3")


@pytest.mark.parametrize("tree", [None, [2, 2]])
def test_engine_drafts_equal_a_plain_recomputation_and_greedy_output_is_exact(target, head,
                                                                             tree):
    """Drafts in the engine (the runner's layer states from the verification forward, the
    head's cache of verified pairs, d2t) equal those recomputed from nothing by
    :func:`reference_drafts`; the output equals Hugging Face's greedy decoding."""
    directory, weights = head
    llm = make_llm(target, directory, draft_tree=tree)
    seen = recorded(llm.engine.proposer)
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [40, 41, 40, 41, 40]]
    params = SamplingParams(temperature=0, max_tokens=12, ignore_eos=True)
    outs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 12)
    assert len(seen) >= 10 and any(is_tree for *_, is_tree in seen) == (tree is not None)
    for context, chain, _ in seen:
        assert chain == reference_drafts(weights, target, AUX, context, len(chain)), context
        assert all(d in DRAFT_IDS for d in chain)


def test_accepted_and_rejected_drafts_keep_greedy_output_exact(tmp_path, target):
    """A head that always drafts the token the target's greedy text repeats most: some drafts
    are accepted (mapped to target ids before verification), some rejected."""
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32, 33]]
    expected = [hf_greedy(target, p, 16) for p in prompts]
    common = max(range(VOCAB), key=lambda t: sum(e.count(t) for e in expected))
    # norm zeroed: zero logits, whose argmax is draft id 0, which d2t maps to target id common
    ids = [common] + [i for i in DRAFT_IDS if i != common]
    write_eagle3_dir(tmp_path, target.config, ids, aux=AUX,
                     edit=lambda t: t["norm.weight"].zero_())
    llm = make_llm(target, tmp_path)
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=16, ignore_eos=True),
                        use_tqdm=False)
    assert [o.outputs[0].token_ids for o in outs] == expected
    metrics = llm.get_metrics()
    assert 0 < metrics.num_accepted < metrics.num_drafted


def test_a_seeded_sample_equals_its_run_without_speculation(target, head):
    params = [SamplingParams(temperature=0.8 + 0.1 * i, top_k=20, seed=7 + i, max_tokens=12,
                             ignore_eos=True) for i in range(4)]
    prompts = [[5, 17, 3], [8, 8, 9, 10], [40], [2, 3, 2, 3]]
    plain = LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4)
    want = [o.outputs[0].token_ids for o in plain.generate(prompts, params, use_tqdm=False)]
    llm = make_llm(target, head[0])
    got = [o.outputs[0].token_ids for o in llm.generate(prompts, params, use_tqdm=False)]
    assert got == want and llm.get_metrics().num_drafted > 0


def test_export_then_load_gives_the_same_head_and_drafts(tmp_path, target, head):
    directory, _ = head
    loaded = load_eagle3(directory, target.config, VOCAB)
    save_eagle3(loaded, tmp_path, {"rope_theta": 10000.0, "max_position_embeddings": 256},
                "tiny", ["LlamaForCausalLM"], 3)
    again = load_eagle3(tmp_path, target.config, VOCAB)
    for name, tensor in loaded.state_dict().items():
        assert torch.equal(again.state_dict()[name], tensor), name
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["speculators_model_type"] == "eagle3"
    assert config["eagle_aux_hidden_state_layer_ids"] == AUX
    assert config["speculators_config"]["verifier"]["name_or_path"] == "tiny"
    drafts = []
    for d in (directory, tmp_path):
        llm = make_llm(target, d)
        seen = recorded(llm.engine.proposer)
        llm.generate([[5, 17, 3, 60, 22]], SamplingParams(temperature=0, max_tokens=10,
                                                          ignore_eos=True), use_tqdm=False)
        drafts.append(seen)
    assert drafts[0] == drafts[1] and drafts[0]


def test_a_head_with_its_own_embedding_drafts_with_it(tmp_path, target):
    weights = write_eagle3_dir(tmp_path, target.config, DRAFT_IDS, aux=AUX, seed=4,
                               edit=lambda t: t.__setitem__(
                                   "embed_tokens.weight", torch.randn(VOCAB, 64)))
    llm = make_llm(target, tmp_path)
    proposer = llm.engine.proposer
    assert proposer.embed is proposer.head.embed_tokens
    seen = recorded(proposer)
    llm.generate([[5, 17, 3, 60, 22]], SamplingParams(temperature=0, max_tokens=10,
                                                      ignore_eos=True), use_tqdm=False)
    assert seen
    for context, chain, _ in seen:
        assert chain == reference_drafts(weights, target, AUX, context, len(chain))
    save_eagle3(proposer.head, tmp_path / "again", {"rope_theta": 10000.0}, "tiny", [], 3)
    again = load_eagle3(tmp_path / "again", target.config, VOCAB)
    assert torch.equal(again.embed_tokens.weight, weights["embed_tokens.weight"])


def test_a_head_over_the_whole_vocabulary_needs_no_vocabulary_maps(tmp_path, target):
    from safetensors.torch import load_file

    from proposers.speculators import new_eagle3

    head = new_eagle3(target.config, VOCAB, None, tuple(AUX), 96)
    save_eagle3(head, tmp_path, {"rope_theta": 10000.0}, "tiny", [], 3)
    assert not {"d2t", "t2d"} & set(load_file(str(tmp_path / "model.safetensors")))
    again = load_eagle3(tmp_path, target.config, VOCAB)
    assert torch.equal(again.target_ids, torch.arange(VOCAB))
    assert torch.equal(again.lm_head.weight, head.lm_head.weight)


def test_default_aux_layers_are_vllms(tmp_path):
    target = tiny_model("llama", vocab_size=VOCAB, num_layers=8, seed=1)
    write_eagle3_dir(tmp_path, target.config, DRAFT_IDS,
                     config_overrides={"eagle_aux_hidden_state_layer_ids": None})
    assert load_eagle3(tmp_path, target.config, VOCAB).aux_layers == (2, 4, 5)


@pytest.mark.parametrize(("change", "field"), [
    (dict(config_overrides={"target_hidden_size": 32}), "target_hidden_size"),
    (dict(drop=("d2t",)), "d2t"),
    (dict(config_overrides={"speculators_model_type": "medusa"}), "speculators_model_type"),
    (dict(config_overrides={"eagle_aux_hidden_state_layer_ids": [0, 2, 9]}),
     "eagle_aux_hidden_state_layer_ids"),
    (dict(config_overrides={"draft_vocab_size": 40}), "draft_vocab_size=40"),
    (dict(edit=lambda t: t["d2t"].__setitem__(1, 200)), "d2t must map"),
    (dict(edit=lambda t: t.__setitem__("lm_head.weight", t["lm_head.weight"][:, :8])),
     "lm_head.weight"),
    (dict(edit=lambda t: t["t2d"].zero_()), "t2d"),
    (dict(config_overrides={"transformer_layer_config": {"hidden_size": 64}}),
     "transformer_layer_config.num_attention_heads"),
])
def test_bad_heads_are_refused_naming_the_field(tmp_path, target, change, field):
    write_eagle3_dir(tmp_path, target.config, DRAFT_IDS, aux=AUX, **change)
    with pytest.raises(ValueError, match=field.replace(".", r"\.")):
        load_eagle3(tmp_path, target.config, VOCAB)


def test_a_head_for_another_verifier_is_refused_when_the_engine_is_built(tmp_path, target):
    other = tiny_model("llama", vocab_size=VOCAB, num_layers=4, seed=3, hidden_size=32)
    write_eagle3_dir(tmp_path, other.config, DRAFT_IDS, aux=AUX)
    with pytest.raises(ValueError, match="hidden_size=32"):
        make_llm(target, tmp_path)


def layer_inputs(target, tokens: list[int]) -> torch.Tensor:
    """``[len, 3 * hidden]``: the inputs of AUX from Hugging Face (what the runner returns)."""
    with torch.no_grad():
        states = target(torch.tensor([tokens]), output_hidden_states=True).hidden_states
    return torch.cat([states[i][0] for i in AUX], -1)


@pytest.mark.parametrize("tree", [None, [2, 2]], ids=["chains", "trees"])
@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_proposals_across_steps_equal_the_recomputation_exact_or_in_a_graph_layout(
        target, head, graphs, tree):
    """The proposer alone, fed layer states step by step (one request skipping proposals, one
    prompt longer than a graph layout's room): every proposal (a tree's likeliest chain)
    equals :func:`reference_drafts`, run eagerly in exact shapes or padded to a CUDA graph's
    layout."""
    directory, weights = head
    eagle3 = load_eagle3(directory, target.config, VOCAB).eval()
    proposer = DraftHeadProposer(eagle3, target.get_input_embeddings(),
                                 target.get_output_embeddings(), VOCAB, max_num_seqs=4,
                                 max_model_len=64, max_pending=4, graphs=graphs, capture=False,
                                 tree=tree)
    assert proposer.feature_layers == tuple(AUX)
    g = torch.Generator().manual_seed(0)
    contexts = {"a": [5, 6, 7], "b": [9, 3],
                "c": torch.randint(0, VOCAB, (11,), generator=g).tolist()}

    def feed(verified: dict) -> None:
        updates = [FeatureUpdate(r, s, n, contexts[r]) for r, (s, n) in verified.items()]
        rows = [layer_inputs(target, contexts[r])[s:s + n] for r, (s, n) in verified.items()]
        proposer.on_features(updates, torch.cat(rows))

    feed({r: (0, len(t) - 1) for r, t in contexts.items()})
    for step, ks in enumerate([{"a": 3, "b": 2, "c": 3}, {"a": 2, "c": 1},
                               {"a": 3, "b": 3, "c": 2}]):
        requests = [ProposeRequest(r, contexts[r], k, SamplingParams(temperature=0),
                                   tree=tree is not None) for r, k in ks.items()]
        got = proposer.propose(requests)
        assert got.draft_probs is None  # (one-hot drafts of target ids)
        parents = got.parents or [None] * len(requests)
        for (req, k), drafts, par in zip(ks.items(), got.draft_token_ids, parents, strict=True):
            assert (par is not None) == (tree is not None)
            chain = likeliest_chain(drafts, par)
            assert chain == reference_drafts(weights, target, AUX, contexts[req], k), (step, req)
        verified = {}
        for req, tokens in contexts.items():  # the first draft kept or not, then a bonus
            start = len(tokens) - 1
            chains = [likeliest_chain(d, p) for d, p in zip(got.draft_token_ids, parents,
                                                             strict=True)]
            drafts = dict(zip(ks, chains, strict=True)).get(req, [])
            tokens.extend(drafts[:(step + len(req)) % 2] + [(step * 7 + len(tokens)) % VOCAB])
            verified[req] = (start, len(tokens) - 1 - start)
        feed(verified)
    if graphs:
        assert proposer.graphs.num_replays >= 1


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a CUDA device")
def test_on_a_gpu_graphed_steps_return_the_layer_states_and_keep_drafts_and_output_exact(head):
    """On a GPU the target's verification forwards replay CUDA graphs whose outputs hold the
    aux layers' states, and the head's proposals replay graphs too: output equals Hugging
    Face's greedy decoding and every chain equals the recomputation on the CPU (float32: the
    same argmax but for near ties, which a random head's 48 logits make unlikely)."""
    import copy

    directory, weights = head
    cpu_target = tiny_model("llama", vocab_size=VOCAB, num_layers=4, seed=3)
    gpu_target = copy.deepcopy(cpu_target).cuda()
    llm = LLM(model=gpu_target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
              speculative_config={"model": str(directory), "num_speculative_tokens": 3,
                                  "adaptive_k": False})
    seen = recorded(llm.engine.proposer)
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [40, 41, 40, 41, 40]]
    outs = llm.generate(prompts, SamplingParams(temperature=0, max_tokens=24, ignore_eos=True),
                        use_tqdm=False)
    for prompt, out in zip(prompts, outs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(cpu_target, prompt, 24)
    assert llm.engine.runner.graphs.num_replays > 0
    assert llm.engine.proposer.graphs.num_replays > 0
    for context, chain, _ in seen:
        assert chain == reference_drafts(weights, cpu_target, AUX, context, len(chain))


def test_a_hub_id_in_the_local_cache_loads_and_infers_the_method(tmp_path, monkeypatch, target):
    """A head cached by ``huggingface_hub`` (its layout written by hand here) is found by its
    hub id without a download; an id not in the cache is a ValueError naming the model."""
    from huggingface_hub import constants

    repo = tmp_path / "hub" / "models--org--tiny-eagle3"
    (repo / "refs").mkdir(parents=True)
    (repo / "refs" / "main").write_text("0" * 40)
    weights = write_eagle3_dir(repo / "snapshots" / ("0" * 40), target.config, DRAFT_IDS, aux=AUX)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert SpeculativeConfig(model="org/tiny-eagle3").method == "eagle3"
    head = load_eagle3("org/tiny-eagle3", target.config, VOCAB)
    assert torch.equal(head.fc.weight, weights["fc.weight"])
    with pytest.raises(ValueError, match="no config.json"):
        load_eagle3("org/not-cached", target.config, VOCAB)
