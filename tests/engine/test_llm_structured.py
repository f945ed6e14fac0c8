"""Structured output through the engine on a tiny random LLaMA with a character-level
vocabulary: every output matches its constraint, greedy output is the same with and without
speculation (n-gram, a draft model, forced drafts), errors fail their request alone."""

from __future__ import annotations

import json
import re

import pytest
from conftest import tiny_model

from engine import LLM, SamplingParams, StructuredOutputsParams
from tests.engine.structured_helpers import EOS_ID, char_tokenizer
from tests.engine.test_llm_greedy import noisy_copy

VOCAB = 128
NAMES = ["ann", "bob", "carol"]
SCHEMA = {"type": "object",
          "properties": {"name": {"enum": NAMES}, "ok": {"type": "boolean"},
                         "tags": {"type": "array", "items": {"enum": ["x", "yy"]},
                                  "maxItems": 2},
                         "pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog"]}},
                                 "required": ["kind"], "additionalProperties": False}},
          "required": ["name", "ok", "tags", "pet"], "additionalProperties": False}
REGEX = r"[ab]{2,4}-(x|yz)\.[0-9]"
CHOICES = ["yes", "no", "not sure"]
PROMPTS = ['say {"name": "bob", "ok": false, "tags": ["x"], "pet": {"kind": "cat"}}', "abc",
           "hello there", "ab-x.1 ab-yz.2"]


@pytest.fixture(scope="module")
def target():
    return tiny_model("llama", vocab_size=VOCAB, seed=0, eos_token_id=EOS_ID)


def llm_for(target, spec=None, **engine) -> LLM:
    return LLM(model=target, tokenizer=char_tokenizer(), speculative_config=spec,
               max_model_len=256, **engine)


def valid_json(text: str) -> bool:
    """The schema checked by hand."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError:
        return False
    return (isinstance(value, dict) and set(value) == {"name", "ok", "tags", "pet"}
            and value["name"] in NAMES and isinstance(value["ok"], bool)
            and isinstance(value["tags"], list) and len(value["tags"]) <= 2
            and all(t in ("x", "yy") for t in value["tags"]) and value["pet"] in (
                {"kind": "cat"}, {"kind": "dog"}))


# (free whitespace, or any JSON object, lets a random model write spaces or digits until
# max_tokens: the JSON case here has neither; the greedy comparisons add those)
CASES = [({"json": SCHEMA, "disable_any_whitespace": True}, valid_json),
         ({"regex": REGEX}, lambda t: re.fullmatch(REGEX, t) is not None),
         ({"choice": CHOICES}, lambda t: t in CHOICES),
         ({"grammar": 'root ::= "(" [0-9]+ ")" | "none"'},
          lambda t: re.fullmatch(r"\([0-9]+\)|none", t) is not None)]
SPECS = {"none": None, "ngram": {"method": "ngram", "num_speculative_tokens": 4}}


@pytest.mark.parametrize("spec", list(SPECS))
@pytest.mark.parametrize("case", range(len(CASES)))
def test_every_output_matches_its_constraint(target, spec, case):
    constraint, valid = CASES[case]
    llm = llm_for(target, SPECS[spec])
    params = [SamplingParams(temperature=t, seed=s, max_tokens=200,
                             structured_outputs=StructuredOutputsParams(**constraint))
              for t, s in [(0.0, None), (1.0, 1), (1.0, 2), (1.5, 3)]]
    for p in params:
        for out in llm.generate(PROMPTS, p, use_tqdm=False):
            c = out.outputs[0]
            assert c.finish_reason == "stop", (c.text, c.finish_reason)
            assert valid(c.text), c.text
            assert c.token_ids[-1] == EOS_ID


GREEDY_SPECS = [
    None,
    {"method": "ngram", "num_speculative_tokens": 4},
    {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2},
]


UNBOUNDED = [{"json": SCHEMA}, {"json_object": True}]


@pytest.mark.parametrize("case", range(len(CASES) + len(UNBOUNDED)))
def test_greedy_output_is_the_same_with_and_without_speculation(target, case):
    constraint = StructuredOutputsParams(**(CASES + [(u, None) for u in UNBOUNDED])[case][0])
    params = SamplingParams(temperature=0, max_tokens=120, structured_outputs=constraint)
    plain = llm_for(target, None, structured_forced_tokens=0)
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params, use_tqdm=False)]
    assert plain.get_metrics().num_drafted == 0
    draft = noisy_copy(target, 0.3, seed=1)
    model_spec = {"method": "draft_model", "model": draft, "tokenizer": char_tokenizer(),
                  "num_speculative_tokens": 3}
    for spec in [*GREEDY_SPECS, model_spec]:
        for forced in (0, 8):
            llm = llm_for(target, spec, structured_forced_tokens=forced)
            got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
            assert got == expected, (spec, forced)


def test_the_walk_in_a_worker_thread_gives_the_same_outputs(target):
    """A GPU engine walks the drafts in a worker thread beside the forward: on the CPU too,
    greedy and seeded outputs are those of the walk in the step's own thread."""
    constraint = StructuredOutputsParams(json=SCHEMA)
    params = [SamplingParams(temperature=0, max_tokens=120, structured_outputs=constraint),
              SamplingParams(temperature=1.0, seed=7, max_tokens=120,
                             structured_outputs=constraint)]
    spec = {"method": "ngram", "num_speculative_tokens": 4}
    outputs = []
    for overlap in (False, True):
        llm = llm_for(target, spec)
        llm.engine.grammar_masks.overlap = overlap
        outputs.append([[o.outputs[0].token_ids for o in llm.generate(PROMPTS, p,
                                                                       use_tqdm=False)]
                        for p in params])
        assert (llm.engine.grammar_masks.pool is not None) == overlap
        assert llm.engine.grammar_masks.walk_seconds > 0
    assert outputs[0] == outputs[1]


def test_forced_tokens_are_drafted_without_a_speculative_method(target):
    """The schema's keys and punctuation are forced: drafted and accepted with no proposer."""
    constraint = StructuredOutputsParams(json=SCHEMA, disable_any_whitespace=True)
    params = SamplingParams(temperature=0, max_tokens=200, structured_outputs=constraint)
    llm = llm_for(target, None)
    out = llm.generate(PROMPTS, params, use_tqdm=False)
    assert all(valid_json(o.outputs[0].text) for o in out)
    m = llm.get_metrics()
    assert m.num_drafted > 0 and m.num_accepted > 0
    # (not all: the forced text has other tokenizations, '{' '"' for '{"', that the target
    # may prefer)
    steps = sum(o.metrics.num_steps for o in out)
    tokens = sum(len(o.outputs[0].token_ids) for o in out)
    assert steps < tokens  # fewer steps than tokens: forced tokens come several a step


def test_an_output_cut_by_max_tokens_ends_with_length_and_a_valid_prefix(target):
    params = SamplingParams(temperature=0, max_tokens=5, structured_outputs={"json": SCHEMA})
    for spec in SPECS.values():
        for out in llm_for(target, spec).generate(PROMPTS, params, use_tqdm=False):
            c = out.outputs[0]
            assert c.finish_reason == "length" and len(c.token_ids) == 5
            assert c.text.startswith("{")


def test_a_constraint_that_does_not_compile_is_a_value_error_and_nothing_stays(target):
    llm = llm_for(target, SPECS["ngram"])
    bad = SamplingParams(max_tokens=8, structured_outputs={"regex": "(unclosed"})
    with pytest.raises(ValueError, match=r"StructuredOutputsParams\.regex='\(unclosed'"):
        llm.generate(PROMPTS, bad, use_tqdm=False)
    with pytest.raises(ValueError, match=r"StructuredOutputsParams\.json=.*does not compile"):
        llm.generate(PROMPTS, SamplingParams(structured_outputs={"json": {"type": "objekt"}}),
                     use_tqdm=False)
    assert not llm.engine.requests and not llm.engine.has_work()
    good = SamplingParams(temperature=0, max_tokens=40, structured_outputs={"choice": CHOICES})
    assert all(o.outputs[0].text in CHOICES for o in llm.generate(PROMPTS, good, use_tqdm=False))


def test_a_bad_request_added_to_a_running_engine_fails_alone(target):
    """Added past the checks (as a server's engine loop does), the request finishes with an
    error; the others complete and the engine holds nothing after."""
    llm = llm_for(target, SPECS["ngram"])
    engine = llm.engine
    ids = char_tokenizer().encode("abc", add_special_tokens=False)
    good = SamplingParams(temperature=0, max_tokens=60, structured_outputs={"regex": REGEX})
    engine.add_request("good-1", None, ids, good)
    engine.step()
    engine.add_request("bad", None, ids, SamplingParams(structured_outputs={"grammar": "x ::="}))
    engine.add_request("good-2", None, ids, good)
    while engine.has_work():
        engine.step()
    bad = engine.pop_request("bad")[0]
    assert bad.finish_reason == "error" and "StructuredOutputsParams.grammar" in bad.error
    for rid in ("good-1", "good-2"):
        seq = engine.pop_request(rid)[0]
        assert seq.finish_reason == "stop" and re.fullmatch(REGEX, seq.text)
    assert not engine.requests and not engine.scheduler.has_unfinished


def test_ignore_eos_ends_when_the_grammar_ends(target):
    """With ignore_eos the stop token does not stop the sample; the grammar's end does (its
    matcher is never asked for another mask)."""
    params = SamplingParams(temperature=0, max_tokens=50, ignore_eos=True,
                            structured_outputs={"choice": CHOICES})
    for out in llm_for(target, SPECS["ngram"]).generate(PROMPTS, params, use_tqdm=False):
        c = out.outputs[0]
        assert c.finish_reason == "stop" and c.text in CHOICES


def test_a_seeded_sample_is_the_same_with_and_without_speculation(target):
    """A seeded request's token at each position is its keyed sample of the masked target
    distribution (samplers.keyed_random), whatever drafts a step verifies."""
    params = [SamplingParams(temperature=1.0, seed=s, max_tokens=80,
                             structured_outputs={"regex": REGEX}) for s in range(4)]
    plain = llm_for(target, None, structured_forced_tokens=0)
    expected = [o.outputs[0].token_ids for o in plain.generate(PROMPTS, params, use_tqdm=False)]
    assert len({tuple(e) for e in expected}) > 1  # the seeds give different samples
    draft = noisy_copy(target, 0.3, seed=1)
    for spec in (SPECS["ngram"], {"method": "draft_model", "model": draft,
                                  "tokenizer": char_tokenizer(), "num_speculative_tokens": 3}):
        llm = llm_for(target, spec)
        got = [o.outputs[0].token_ids for o in llm.generate(PROMPTS, params, use_tqdm=False)]
        assert got == expected, spec


@pytest.mark.parametrize("spec", list(SPECS))
def test_forced_drafts_stop_at_the_context_length(target, spec):
    """A grammar that forces its whole text meets the end of the context: the forced drafts
    stop there and the output ends with 'length', a prefix of the text."""
    text = "abcdefghijklmnopqrstuvwxyz0123456789"
    llm = LLM(
        model=target, tokenizer=char_tokenizer(), speculative_config=SPECS[spec],
        max_model_len=24)
    prompt = "0123456789"  # 10 tokens: room for 14
    params = SamplingParams(temperature=0, max_tokens=None, structured_outputs={"regex": text})
    c = llm.generate([prompt], params, use_tqdm=False)[0].outputs[0]
    assert c.finish_reason == "length" and c.text == text[:14]
