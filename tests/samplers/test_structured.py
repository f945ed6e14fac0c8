"""Structured output's parts below the engine: the params' checks, compiling, the draft walk's
masks and cuts, the matcher's advance after a walk, forced tokens, applying a bitmask, and
verification never accepting a token after a draft the grammar refuses; on a character-level
vocabulary whose ids the tests read from the vocabulary itself."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from samplers import (
    GreedySampler,
    RejectionSampler,
    SamplingParams,
    SamplingTensors,
    SpecDecodeMetadata,
)
from samplers.structured import (
    Grammars,
    GrammarState,
    StructuredOutputsParams,
    apply_bitmask,
    walk_drafts,
)
from tests.engine.structured_helpers import EOS_ID, char_tokenizer, char_vocab

VOCAB = 128
ID = char_vocab()


@pytest.fixture(scope="module")
def grammars() -> Grammars:
    return Grammars(char_tokenizer(), VOCAB, [EOS_ID])


def allowed(mask_row: torch.Tensor) -> set[int]:
    """The token ids a bitmask row allows (bit t % 32 of word t // 32), read bit by bit."""
    return {t for t in range(VOCAB) if (int(mask_row[t // 32]) >> (t % 32)) & 1}


def state(grammars: Grammars, **kind) -> GrammarState:
    return GrammarState(grammars.compile(StructuredOutputsParams(**kind)), VOCAB)


def walk(grammars: Grammars, states: list[GrammarState], drafts: list[list[int]]
         ) -> tuple[list[int], list[torch.Tensor]]:
    """:func:`walk_drafts` into a buffer of zeros (so that a row the walk leaves is seen), one
    sample's rows after the other's; each sample's masks ``[len(drafts) + 1, words]``."""
    sizes = [len(d) + 1 for d in drafts]
    offsets = [sum(sizes[:i]) for i in range(len(sizes))]
    bitmask = np.zeros((sum(sizes), (VOCAB + 31) // 32), dtype=np.int32)
    accepted = walk_drafts(states, drafts, grammars.batcher, bitmask, offsets)
    return accepted, [torch.from_numpy(bitmask[o:o + n])
                      for o, n in zip(offsets, sizes, strict=True)]


@pytest.mark.parametrize("kwargs, kind, field", [
    (dict(), ValueError, "exactly one"),
    (dict(regex="a", choice=["b"]), ValueError, "exactly one"),
    (dict(json="{not json"), ValueError, "json"),
    (dict(json=3), TypeError, "json"),
    (dict(regex=""), ValueError, "regex"),
    (dict(choice="yes"), TypeError, "choice"),
    (dict(choice=[]), ValueError, "choice"),
    (dict(json_object="yes"), TypeError, "json_object"),
])
def test_bad_params_name_the_field(kwargs, kind, field):
    with pytest.raises(kind, match=field):
        StructuredOutputsParams(**kwargs)


def test_sampling_params_take_a_dict_or_the_older_name():
    assert SamplingParams(structured_outputs={"regex": "a+"}).structured_outputs.regex == "a+"
    old = SamplingParams(guided_decoding=StructuredOutputsParams(choice=["x"]))
    assert old.structured_outputs.choice == ["x"] and old.guided_decoding is None
    with pytest.raises(ValueError, match="unknown keys"):
        SamplingParams(structured_outputs={"jsonschema": {}})
    with pytest.raises(TypeError, match="structured_outputs"):
        SamplingParams(structured_outputs="a+")
    with pytest.raises(ValueError, match="guided_decoding"):
        SamplingParams(structured_outputs={"regex": "a"}, guided_decoding={"regex": "b"})


@pytest.mark.parametrize("kind, value", [("regex", "[a-"), ("grammar", "root ::= undefined"),
                                         ("json", {"type": "objekt"})])
def test_what_does_not_compile_is_a_value_error_naming_it(grammars, kind, value):
    with pytest.raises(ValueError, match=rf"StructuredOutputsParams\.{kind}=.*does not compile"):
        grammars.compile(StructuredOutputsParams(**{kind: value}))


def test_a_constraint_compiles_once(grammars):
    schema = {"type": "object", "properties": {"b": {"type": "integer"}, "a": {"type": "null"}}}
    first = grammars.compile(StructuredOutputsParams(json=schema))
    # (the same schema, its keys in another order)
    again = grammars.compile(StructuredOutputsParams(json=dict(reversed(schema.items()))))
    assert again is first
    assert grammars.compile(StructuredOutputsParams(json=schema, disable_any_whitespace=True)
                            ) is not first


def test_the_walk_masks_each_position_up_to_the_first_refused_draft(grammars):
    s = state(grammars, regex="ab(c|d)")
    drafts = [ID["a"], ID["b"], ID["x"], ID["c"]]
    accepted, masks = walk(grammars, [s], [drafts])
    assert accepted == [2]  # 'x' is refused
    assert masks[0].shape == (5, 4)
    assert allowed(masks[0][0]) == {ID["a"]}
    assert allowed(masks[0][1]) == {ID["b"]}
    assert allowed(masks[0][2]) == {ID["c"], ID["d"]}  # 'x' gets probability 0 here
    # after the refused draft: never sampled, so nothing is asked of the grammar
    assert allowed(masks[0][3]) == allowed(masks[0][4]) == set(range(VOCAB))
    assert s.walked == [ID["a"], ID["b"]]
    # a walk not committed does not count: the next one starts from the output again
    accepted, again = walk(grammars, [s], [[ID["a"]]])
    assert accepted == [1] and allowed(again[0][0]) == {ID["a"]}


def test_the_walk_stops_after_the_stop_token_and_batches_samples(grammars):
    done = state(grammars, regex="ab")
    other = state(grammars, choice=["no", "nay"])
    accepted, masks = walk(grammars, [done, other],
                           [[ID["a"], ID["b"], EOS_ID, ID["a"]], [ID["n"], ID["a"]]])
    assert accepted == [3, 2]
    assert allowed(masks[0][2]) == {EOS_ID}  # the grammar is complete: only the stop token
    assert allowed(masks[0][3]) == set(range(VOCAB))  # after it: the matcher is not asked
    assert allowed(masks[1][1]) == {ID["o"], ID["a"]}
    assert allowed(masks[1][2]) == {ID["y"]}


def test_advance_follows_kept_tokens_and_terminates(grammars):
    s = state(grammars, regex="ab")
    assert s.advance([ID["a"]])
    accepted, _ = walk(grammars, [s], [[ID["a"]]])
    assert accepted == [0]  # 'a' again is refused: the matcher has moved past it
    assert s.advance([ID["b"], EOS_ID]) and s.terminated
    assert s.forced_tokens(8) == []
    refusing = state(grammars, regex="ab")
    assert not refusing.advance([ID["b"]])


@pytest.mark.parametrize("kept, then", [
    ([], {ID["a"]}),  # nothing kept (a failed row): every walked draft rolls back
    (["a"], {ID["b"]}),  # the first draft accepted, the second rejected
    (["a", "b"], {ID["c"], ID["d"]}),  # both drafts kept, no more (a stop cut the step)
    (["a", "b", "d"], {EOS_ID}),  # both accepted, then the bonus token
])
def test_advance_after_a_walk_keeps_the_accepted_drafts_and_rolls_back_the_rest(
        grammars, kept, then):
    s = state(grammars, regex="ab(c|d)")
    assert walk(grammars, [s], [[ID["a"], ID["b"]]])[0] == [2]
    assert s.advance([ID[c] for c in kept]) and s.walked == []
    assert allowed(walk(grammars, [s], [[]])[1][0][0]) == then


def test_forced_tokens_are_the_grammar_s_only_continuation(grammars):
    s = state(grammars, regex="abc(d|e)")
    assert s.forced_tokens(8) == [ID["a"], ID["b"], ID["c"]]
    assert s.forced_tokens(2) == [ID["a"], ID["b"]]
    assert s.advance([ID["a"], ID["b"], ID["c"]])
    assert s.forced_tokens(8) == []  # d or e: a choice


def test_apply_bitmask_sets_refused_tokens_to_minus_inf_row_by_row():
    logits = torch.zeros(2, 70)
    bitmask = torch.full((2, 3), -1, dtype=torch.int32)  # row 0 allows everything
    bitmask[1] = 0
    bitmask[1, 0] = (1 << 1) | (1 << 3)
    bitmask[1, 2] = 1 << 5  # token 69
    apply_bitmask(logits, bitmask)
    assert torch.isfinite(logits[1]).nonzero().flatten().tolist() == [1, 3, 69]
    assert torch.isfinite(logits[0]).all()
    with pytest.raises(ValueError, match="does not match"):
        apply_bitmask(logits, bitmask[:1])


@pytest.mark.parametrize("sampler, temperature, drafted", [
    (GreedySampler(), 0.0, "one-hot"), (RejectionSampler(), 1.0, "one-hot"),
    (RejectionSampler(), 1.0, "sampled")])
def test_no_token_after_a_refused_draft_is_ever_accepted(grammars, sampler, temperature,
                                                         drafted):
    """A refused draft stays in the forward (the walk runs in its shadow); its masked target
    probability is 0, so verification stops there whatever the target and the draft's own
    probability, and draws that position's token from the grammar's tokens."""
    s = state(grammars, regex="ab(c|d)e")
    # 'x' refused after "ab"; the drafts after it are what the grammar would take after "abc"
    drafts = [ID["a"], ID["b"], ID["x"], ID["e"]]
    _, masks = walk(grammars, [s], [drafts])
    metadata = SpecDecodeMetadata.from_lists([drafts])
    sampling = SamplingTensors.from_params([SamplingParams(temperature=temperature)])
    generator = torch.Generator().manual_seed(0)
    for trial in range(200):
        logits = torch.randn(len(drafts) + 1, VOCAB, generator=generator) * 4
        logits[:, drafts] += 8.0  # (a target that likes the drafts, the refused one too)
        apply_bitmask(logits, masks[0])
        probs = None
        if drafted == "sampled":  # (a draft model that is sure of its drafts, 'x' included)
            probs = torch.full((len(drafts), VOCAB), 0.01 / VOCAB)
            probs[torch.arange(len(drafts)), drafts] += 0.99
        out = sampler.verify(logits, metadata, sampling, probs).tolist()[0]
        assert out[:2] == [ID["a"], ID["b"]], (trial, out)  # (the grammar leaves no choice)
        assert out[2] in (ID["c"], ID["d"]) and out[3:] == [-1, -1], (trial, out)
