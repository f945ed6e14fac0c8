"""Draft trees (``SpeculativeConfig.draft_tree``): the head's tree against a written-out
oracle, and greedy output equal to Hugging Face's when the engine verifies trees (batches,
staggered arrivals, chunked prefill and preemption, requests that get chains beside them)."""

from __future__ import annotations

import pytest
import torch

from engine import LLM, SamplingParams, llm_engine
from engine.config import SpeculativeConfig
from engine.draft_trees import pruned_tree, tree_depth
from proposers.base import ProposeRequest
from proposers.draft_head import DraftTree
from tests.engine.llm_helpers import hf_greedy, tiny_tokenizer
from tests.proposers.test_draft_head import (
    VOCAB,
    feed,
    head_dir,  # noqa: F401 - a fixture
    head_prediction,
    hidden_of,
    make_proposer,
    random_head,
    target,  # noqa: F401 - a fixture
)


def oracle_children(head, embed, lm_head, features, tokens, branch, count) -> list[int]:
    """Written out: the head over the whole context's pairs as one causal sequence, then the
    branch's tokens fed one by one with the previous prediction (no cache, no tree mask);
    the ``count`` likeliest next tokens after the branch."""
    feats, toks = list(features), list(tokens[1:])
    for token in branch:
        feats.append(head_prediction(head, embed, feats, toks))
        toks.append(token)
    with torch.no_grad():
        return lm_head(head_prediction(head, embed, feats, toks)).topk(count).indices.tolist()


def test_tree_layout():
    tree = DraftTree([3, 2], 4, torch.device("cpu"))
    assert tree.num_nodes == 3 + 6 + 6 + 6 and tree.sizes == [0, 3, 9, 15, 21]
    assert tree.parents[:9] == [-1, -1, -1, 0, 0, 1, 1, 2, 2]
    assert tree.parents[9:15] == [3, 4, 5, 6, 7, 8] and tree.chain == [0, 3, 9, 15]
    assert tree.ancestors[15].nonzero().flatten().tolist() == [0, 3, 9, 15]
    assert tree_depth(tree.parents) == 4 and tree_depth([-1, -1]) == 1
    # within 2 levels; then the best 4 nodes: the likeliest chain; then 6: the chain and the
    # two branches one step off it nearest the root (node 1, the second first draft, and node
    # 4, the second draft after node 0)
    assert pruned_tree(list(range(21)), tree.parents, 2, 99) == (
        list(range(9)), tree.parents[:9])
    assert pruned_tree(list(range(21)), tree.parents, 4, 4) == ([0, 3, 9, 15], [-1, 0, 1, 2])
    assert pruned_tree(list(range(21)), tree.parents, 4, 6) == (
        [0, 1, 3, 4, 9, 15], [-1, -1, 0, 0, 2, 4])


@pytest.mark.parametrize("chunk", [128, 8], ids=["one-topk", "two-pass"])
@pytest.mark.parametrize("graphs", [False, True], ids=["exact", "padded-layout"])
def test_tree_drafts_equal_the_written_out_oracle(target, graphs, chunk,  # noqa: F811
                                                  monkeypatch):
    """Every node's children are the head's likeliest tokens after that node's branch alone;
    a request not allowed a tree gets the chain of the likeliest, as without trees. The
    target's 96 tokens take one ``topk`` each; with 8-column chunks, the two-pass selection
    (``top_indices``) that a real vocabulary takes."""
    from proposers import draft_head

    monkeypatch.setattr(draft_head, "TOP_CHUNK", chunk)
    assert (VOCAB >= 4 * chunk) == (chunk == 8)  # (which path each case takes)
    head = random_head(target.config, seed=4)
    embed, lm_head = target.get_input_embeddings(), target.get_output_embeddings()
    proposer = make_proposer(target, head, graphs=graphs)
    proposer.branching = [3, 2]
    chains = make_proposer(target, head, graphs=graphs)
    contexts = {"a": [5, 6, 7, 8, 9], "b": [9, 3], "c": [11, 40, 2, 7, 7, 30, 1]}
    for p in (proposer, chains):
        feed(p, target, contexts, {r: (0, len(t) - 1) for r, t in contexts.items()})
    requests = [ProposeRequest("a", contexts["a"], 3, SamplingParams(temperature=0), tree=True),
                ProposeRequest("b", contexts["b"], 2, SamplingParams(temperature=0), tree=True),
                ProposeRequest("c", contexts["c"], 3, SamplingParams(temperature=0))]
    got = proposer.propose(requests)
    tree = DraftTree([3, 2], 3, torch.device("cpu"))
    for r, nodes, parents in zip(requests, got.draft_token_ids, got.parents, strict=True):
        feats = hidden_of(target, contexts[r.req_id])[:-1]
        if not r.tree:
            assert parents is None
            assert nodes == chains.propose([r]).draft_token_ids[0]
            continue
        assert parents == tree.parents[:tree.sizes[r.num_spec_tokens]]
        for node in [-1, *range(len(nodes))]:
            kids = [c for c, p in enumerate(parents) if p == node]
            if not kids:
                continue
            branch, up = [], node
            while up >= 0:
                branch.insert(0, nodes[up])
                up = parents[up]
            want = oracle_children(head, embed, lm_head, feats, contexts[r.req_id], branch,
                                   len(kids))
            assert [nodes[c] for c in kids] == want, (r.req_id, node)


def tree_llm(target, head_dir, tree, **kwargs) -> LLM:  # noqa: F811
    spec = {"method": "eagle", "model": str(head_dir), "num_speculative_tokens": 3,
            "draft_tree": tree, "adaptive_k": False, **kwargs.pop("spec", {})}
    return LLM(model=target, tokenizer=tiny_tokenizer(VOCAB), max_num_seqs=4,
               speculative_config=spec, **kwargs)


def off_chain_paths(llm: LLM) -> list[list[int]]:
    """Record the accepted branches that are not the tree's first nodes (the runner moves
    its columns for those only)."""
    moved = []
    runner = llm.engine.runner
    keep = runner.keep_paths

    def recording(paths):
        moved.extend(list(p) for _, _, p in paths if list(p) != list(range(len(p))))
        keep(paths)

    runner.keep_paths = recording
    return moved


# (3: trees once one has finished; paged: tree steps read the pool in place, the tree bits
# reaching attention through the slot table and keep_paths moving the kept branch's columns)
@pytest.mark.parametrize("batch,backend", [(1, "gather"), (2, "gather"), (3, "gather"),
                                           (2, "paged")])
def test_greedy_output_with_trees_equals_hugging_face(target, head_dir, batch,  # noqa: F811
                                                      backend):
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32, 33, 30, 31], [40]][:batch]
    llm = tree_llm(target, head_dir, [3, 2], attention_backend=backend)
    moved = off_chain_paths(llm)
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 24)
    assert moved  # (branches other than the likeliest chain were accepted)
    metrics = llm.get_metrics()
    assert 0 < metrics.num_accepted <= metrics.num_drafted


def test_greedy_output_with_gated_trees_equals_hugging_face(target, head_dir):  # noqa: F811
    """With the adaptive policy (its guard on) trees run only where they measured faster
    (``scheduler.tree_gate``): steps of trees and of chains alternate while it explores, and
    the output is Hugging Face's whichever a step drafts."""
    prompts = [[5, 17, 3, 60, 22], [30, 31, 32, 33, 30, 31]]
    llm = tree_llm(target, head_dir, [3, 2], spec={"adaptive_k": True})
    gate = llm.engine.controller.trees
    assert gate is not None
    params = SamplingParams(temperature=0, max_tokens=40, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 40)
    assert gate.tree_steps > 0 and gate.chain_steps > 0


def test_trees_only_in_small_batches(target, head_dir):  # noqa: F811
    """At most ``TREE_MAX_SEQS`` (2) sequences that may draft trees: a tree each; 3: chains for
    all; the output stays Hugging Face's."""
    assert llm_engine.TREE_MAX_SEQS == 2
    llm = tree_llm(target, head_dir, [3, 2])
    sizes: list[list[int]] = []
    forward = llm.engine.runner.forward

    def recording(slots, tokens, logits_indices=None, trees=None, **kwargs):
        sizes.append([len(t[1]) for t in trees or [] if t is not None])
        return forward(slots, tokens, logits_indices, trees=trees, **kwargs)

    llm.engine.runner.forward = recording
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32, 33, 30, 31]]
    lengths = [12, 9, 6]  # (3 run, then 2, then 1)
    outputs = llm.generate(prompts, [SamplingParams(temperature=0, max_tokens=n,
                                                    ignore_eos=True) for n in lengths],
                           use_tqdm=False)
    for prompt, n, out in zip(prompts, lengths, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, n)
    # (the prefill, then 3 decoding: chains; then 2 trees; then 1. A full tree of 3 levels has
    # 3 + 6 + 6 nodes; near its end a sequence's tree is only as deep as its tokens left)
    assert sizes[:4] == [[]] * 4 and not any(len(s) > 2 for s in sizes)
    assert [15, 3] in sizes and any(len(s) == 1 for s in sizes)


def test_trees_with_chunked_prefill_preemption_and_staggered_arrivals(target,  # noqa: F811
                                                                     head_dir):  # noqa: F811
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(2, VOCAB, (n,), generator=g).tolist() for n in (21, 17, 9)]
    llm = tree_llm(target, head_dir, [2, 2], max_num_batched_tokens=16, kv_cache_tokens=72)
    moved = off_chain_paths(llm)
    params = SamplingParams(temperature=0, max_tokens=14, ignore_eos=True)
    stream = llm.generate_stream([[5, 17, 3]], params)
    first = next(stream)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    rest = [first, *stream]
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 14)
    assert [t for d in rest for t in d.token_ids] == hf_greedy(target, [5, 17, 3], 14)
    assert llm.get_metrics().num_preemptions > 0 and moved
    proposer = llm.engine.proposer
    assert not proposer.cache.slot_of and not proposer._pending
    assert llm.engine.runner.num_cached_tokens == 0


def test_a_tree_near_the_context_limit_takes_only_the_columns_left(target,  # noqa: F811
                                                                  head_dir):  # noqa: F811
    """Every node takes a column until verification: at the end of ``max_model_len`` the tree
    is cut to the columns left (a 10-node tree, 2 columns left: no error, same output)."""
    llm = tree_llm(target, head_dir, [2, 2], max_model_len=20)
    params = SamplingParams(temperature=0, max_tokens=15, ignore_eos=True)
    out = llm.generate([[5, 17, 3, 60, 22]], params, use_tqdm=False)[0].outputs[0]
    assert out.token_ids == hf_greedy(target, [5, 17, 3, 60, 22], 15)


@pytest.mark.parametrize("other", [
    SamplingParams(temperature=0, max_tokens=16, ignore_eos=True, repetition_penalty=1.3),
    SamplingParams(temperature=0.8, seed=5, max_tokens=16, ignore_eos=True),
    SamplingParams(temperature=0.8, max_tokens=16, ignore_eos=True)],
    ids=["penalised", "seeded", "sampled"])  # (sampled: trees only with draft_tree_sampling)
def test_requests_that_cannot_verify_trees_get_chains_beside_them(target,  # noqa: F811
                                                                   head_dir,  # noqa: F811
                                                                   other):
    """A penalised greedy request, a seeded sample or an unseeded one (the engine's seed) runs in
    the same steps as a greedy tree request: each gives what it gives with chains only."""
    prompts = [[5, 17, 3, 60, 22], [8, 8, 9]]
    params = [SamplingParams(temperature=0, max_tokens=16, ignore_eos=True), other]
    with_trees = tree_llm(target, head_dir, [3, 2], seed=7)
    moved = off_chain_paths(with_trees)
    kinds = tree_kinds(with_trees)
    chains = tree_llm(target, head_dir, None, seed=7)
    got = [o.outputs[0].token_ids for o in with_trees.generate(prompts, params, use_tqdm=False)]
    want = [o.outputs[0].token_ids for o in chains.generate(prompts, params, use_tqdm=False)]
    assert got[0] == want[0] == hf_greedy(target, prompts[0], 16) and moved
    assert (True, False) in kinds  # (a tree beside a chain, in one forward)
    if other.seed is not None or other.greedy:  # (unseeded: the engine's random stream is
        assert got[1] == want[1]  # spent differently when the greedy one verifies a tree)


def test_a_step_of_three_drafts_chains_even_if_one_could_draft_a_tree(target,  # noqa: F811
                                                                     head_dir):  # noqa: F811
    """Trees only in steps of at most 2 sequences, whatever the others are (a decode graph's
    twin is a chain's width above 2)."""
    llm = tree_llm(target, head_dir, [3, 2])
    kinds = tree_kinds(llm)
    seeded = SamplingParams(temperature=0.8, seed=5, max_tokens=12, ignore_eos=True)
    params = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True), seeded, seeded]
    out = llm.generate([[5, 17, 3, 60, 22], [8, 8, 9], [30, 31, 32]], params, use_tqdm=False)
    assert out[0].outputs[0].token_ids == hf_greedy(target, [5, 17, 3, 60, 22], 12)
    assert not kinds  # (no forward had a tree)


def tree_kinds(llm: LLM) -> list[tuple[bool, ...]]:
    """Record which sequences of each forward with trees had one."""
    kinds: list[tuple[bool, ...]] = []
    forward = llm.engine.runner.forward

    def recording(slots, tokens, logits_indices=None, trees=None, **kwargs):
        if trees is not None:
            kinds.append(tuple(t is not None for t in trees))
        return forward(slots, tokens, logits_indices, trees=trees, **kwargs)

    llm.engine.runner.forward = recording
    return kinds


def test_ngram_chains_and_head_trees_in_one_step(target, head_dir):  # noqa: F811
    """Method ``ngram_eagle`` with trees: a request whose suffix repeats verifies n-gram's chain,
    the other the head's tree, in the same steps; greedy output equals Hugging Face's."""
    llm = tree_llm(target, head_dir, [3, 2], spec={"method": "ngram_eagle"})
    moved = off_chain_paths(llm)
    kinds = tree_kinds(llm)
    prompts = [[5, 6, 7, 8, 5, 6, 7, 8, 5, 6], [30, 41, 52, 63, 74]]
    params = SamplingParams(temperature=0, max_tokens=20, ignore_eos=True)
    outputs = llm.generate(prompts, params, use_tqdm=False)
    for prompt, out in zip(prompts, outputs, strict=True):
        assert out.outputs[0].token_ids == hf_greedy(target, prompt, 20)
    assert (False, True) in kinds and moved  # (a chain beside a tree, in one forward)


def test_the_tree_option_is_checked():
    with pytest.raises(ValueError, match="draft_tree"):
        SpeculativeConfig(method="ngram", draft_tree=[2])
    with pytest.raises(ValueError, match="draft_tree"):
        SpeculativeConfig(method="eagle", num_speculative_tokens=2, draft_tree=[2, 2, 2])
    with pytest.raises(ValueError, match="draft_tree"):
        SpeculativeConfig(method="eagle", draft_tree=[8, 8])  # 8 + 64 + ... nodes
    with pytest.raises(ValueError, match="draft_tree"):
        SpeculativeConfig(method="eagle", draft_tree=[])
    assert SpeculativeConfig(method="ngram_eagle", draft_tree=(2,)).draft_tree == [2]


@pytest.mark.parametrize("rows,size,count", [
    (3, 16384, 3), (3, 16384, 2), (3, 49152, 3), (3, 512, 3), (3, 512, 1), (3, 640, 5),
    (9, 16384, 3),  # (past 16 rows in all: one topk)
])
def test_top_indices_match_topk(rows, size, count):
    """Whichever way it selects (two passes over 128-column chunks, an argmax, or one topk past
    16 rows), ``top_indices`` picks what one ``topk`` picks, largest first (distinct values: no
    tie to order), over rows of any leading shape."""
    from proposers.draft_head import top_indices

    g = torch.Generator().manual_seed(size + count)
    logits = torch.randperm(2 * rows * size, generator=g).float().view(2, rows, size)
    # the best of a row in one chunk, and the rest spread: both cases of the first pass
    logits[0, 0, 5:5 + count] += 10 * size
    got = top_indices(logits, count)
    assert got.shape == (2, rows, count)
    assert torch.equal(got, logits.topk(count, dim=-1).indices)
