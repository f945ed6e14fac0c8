"""Adjustments from per-slot state on the device (``samplers.slot_adjustments``) against each
sample's own ``LogitsAdjuster.apply`` on the host, bit for bit, through a run of steps: tokens
counted on the device and carried in flight, steps the host made in between (the counts then
made again), steps that raised before their tokens were counted or after (forgotten, then a
host step's tokens in their place), slots changing hands between samples that use different
adjustments, min_tokens' last masked position, and negative zeros beside a bias."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch

from samplers.logits_adjust import LogitsAdjuster
from samplers.sampling_params import SamplingParams
from samplers.slot_adjustments import AdjustedRow, SlotAdjustments
from tests.engine.llm_helpers import EOS_ID, tiny_tokenizer

VOCAB = 40
TOK = tiny_tokenizer(VOCAB)
DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(
    not torch.cuda.is_available(), reason="the CUDA kernels' bits: no CUDA device here"))]

# one sample's parameters each: every adjustment alone and mixed (EOS is in the vocabulary, so
# min_tokens masks it; "w7" and "w9" are one token each, banned always)
PARAMS = [
    dict(repetition_penalty=1.3),
    dict(frequency_penalty=0.7, presence_penalty=-0.4),
    dict(min_tokens=3, stop_token_ids=[5]),
    dict(logit_bias={3: 2.0, 4: -1.5, 39: 0.25}),
    dict(allowed_token_ids=list(range(10, 30)) + [EOS_ID], frequency_penalty=0.3),
    dict(bad_words=["w7", "w9"], repetition_penalty=0.8, logit_bias={7: 3.0, 8: 1.0}),
    dict(min_tokens=5, presence_penalty=0.9, repetition_penalty=1.1, logit_bias={1: 4.0}),
    dict(bad_words=["w35"]),
]


class Sample:
    """A sample on the host: its adjuster, committed output, and the token in flight."""

    def __init__(self, i: int, rng: random.Random) -> None:
        prompt = [rng.randrange(VOCAB) for _ in range(rng.randrange(2, 7))]
        self.first_output = len(prompt)  # (the position of its first output token)
        self.adjuster = LogitsAdjuster(SamplingParams(**PARAMS[i % len(PARAMS)]), prompt,
                                       frozenset({EOS_ID}), TOK)
        assert not self.adjuster.needs_history  # (the engine adjusts those on the host)
        self.output: list[int] = []
        self.pending: int | None = None


def host_step(slots: dict[int, Sample], rng: random.Random) -> None:
    """A step the host made: each sample's token in flight committed, and one more token."""
    for sample in slots.values():
        if sample.pending is not None:
            sample.output.append(sample.pending)
            sample.pending = None
        sample.output.append(rng.randrange(VOCAB))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_slot_state_equals_each_samples_adjuster(device, seed):
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(seed)
    state = SlotAdjustments(VOCAB, torch.device(device),
                            lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64)).to(device))
    slots: dict[int, Sample] = {}
    made = 0
    rebuilt = 0
    rebuild = state._rebuild

    def counted_rebuild(rows, fed):
        nonlocal rebuilt
        rebuilt += len(rows)
        rebuild(rows, fed)

    state._rebuild = counted_rebuild
    for step in range(60):
        # slots change hands: a sample leaves (its token in flight dropped), another comes
        if not slots or rng.random() < 0.2:
            free = [s for s in range(6) if s not in slots]
            if free and (len(slots) < 2 or rng.random() < 0.6):
                slots[rng.choice(free)] = Sample(made, rng)
                made += 1
            elif len(slots) > 1:
                del slots[rng.choice(sorted(slots))]
        order = sorted(slots, key=lambda _: rng.random())
        # a step the host made: every token in flight committed, nothing counted on the device
        if rng.random() < 0.15:
            host_step(slots, rng)
            continue
        # two rows of other samples, left as they are; or the adjusted rows alone, in order
        whole = rng.random() < 0.3
        num_rows = len(order) + (0 if whole else 2)
        logits = (torch.randn(num_rows, VOCAB, generator=gen) * 3).to(device)
        logits[:, EOS_ID] = 9.0  # (where min_tokens masks it, the value changes)
        logits[:, 6] = -0.0  # (a bias elsewhere keeps its sign: torch.equal would not tell)
        where = list(range(num_rows)) if whole else rng.sample(range(num_rows), len(order))
        fed_values, rows, expected = [], [], logits.clone()
        for slot, row in zip(order, where, strict=True):
            sample = slots[slot]
            fed_at = None
            history = list(sample.output)
            if sample.pending is not None:
                fed_at = len(fed_values)
                fed_values.append(sample.pending)
                history.append(sample.pending)
            sample.adjuster.apply(expected[row:row + 1], history)
            rows.append(AdjustedRow(row, slot, sample, sample.adjuster, list(sample.output),
                                    fed_at))
        fed = torch.tensor(fed_values + [0], dtype=torch.long, device=device)
        if rng.random() < 0.15:  # (a step that raised after adjusting: its tokens never
            state.apply(logits.clone(), rows, fed)  # counted, those in flight stay so)
        elif rng.random() < 0.15:  # (one that raised after counting: forgotten, then a step
            # the host made commits other tokens in its place)
            dropped = state.apply(logits.clone(), rows, fed)
            dropped.count(torch.tensor([rng.randrange(VOCAB) for _ in range(num_rows)],
                                       device=device))
            dropped.forget()
            host_step(slots, rng)
            continue
        got = logits.clone()
        adjusted = state.apply(got, rows, fed)
        assert torch.equal(got, expected), f"step {step}"
        assert torch.equal(got.signbit(), expected.signbit()), f"step {step}"
        # the step's tokens: counted on the device; in flight or committed on the host
        tokens = [rng.randrange(VOCAB) for _ in range(num_rows)]
        adjusted.count(torch.tensor(tokens, dtype=torch.long, device=device))
        for slot, row in zip(order, where, strict=True):
            sample = slots[slot]
            if sample.pending is not None:
                sample.output.append(sample.pending)
            sample.pending = tokens[row]
            if rng.random() < 0.3:  # (committed before the next step: nothing in flight)
                sample.output.append(sample.pending)
                sample.pending = None
    assert made >= 6 and rebuilt > 10
    assert state.capacity == 8 and set(state.rows) == {"banned", "min_tokens", "bias",
                                                       "in_prompt"}


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("seed", [0, 1])
def test_chains_equal_each_samples_adjuster_with_their_drafts(device, seed):
    """A drafting step's chains adjusted from slot state (``apply_chains``) against each
    sample's adjuster over its history and its chain's drafts, bit for bit, through a run of
    steps: chains fed from the chain before (its kept tokens counted on the device only, the
    host's output behind), chains launched from the host (counts made again), from a token in
    flight, and chains of other samples left as they are; samples whose min_tokens is still
    ahead are masked by their chains' positions on the device, its last masked row inside a
    chain."""
    rng = random.Random(seed)
    gen = torch.Generator().manual_seed(10 + seed)
    state = SlotAdjustments(VOCAB, torch.device(device),
                            lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64)).to(device))
    slots = {s: Sample(s, rng) for s in range(len(PARAMS))}
    for sample in slots.values():  # (min_tokens of 3 and 5 ahead of some samples)
        sample.output = [rng.randrange(VOCAB) for _ in range(rng.choice([0, 0, 1, 6]))]
        sample.kept: list[int] = []  # (counted on the device, not on the host yet)
    inside = 0  # (chains whose last row before their sample's min_tokens is not their last)
    mark, modes = None, []
    for step in range(40):
        chained = mark is not None and rng.random() < 0.6
        if not chained:  # (the host commits what the chain before kept)
            for sample in slots.values():
                sample.output += sample.kept
                sample.kept = []
        fed_token = not chained and rng.random() < 0.4  # (a plain step's token in flight)
        modes.append("chained" if chained else "fed" if fed_token else "host")
        order = sorted(slots, key=lambda _: rng.random())
        extra = 0 if rng.random() < 0.4 else 2  # (chains of others, left as they are)
        num_chains, width = len(order) + extra, rng.randrange(2, 5)
        where = rng.sample(range(num_chains), len(order))
        drafts = [[rng.randrange(VOCAB) for _ in range(width - 1)] for _ in range(num_chains)]
        logits = (torch.randn(num_chains * width, VOCAB, generator=gen) * 3).to(device)
        logits[:, 6] = -0.0
        expected, rows, fed = logits.clone(), [], []
        base = [rng.randrange(100) for _ in range(num_chains)]  # (others' chains: anywhere)
        for j, (slot, chain) in enumerate(zip(order, where, strict=True)):
            sample = slots[slot]
            if fed_token:
                sample.kept = [rng.randrange(VOCAB)]
                fed.append(sample.kept[0])
            history = sample.output + sample.kept
            sample.adjuster.apply(expected[chain * width:(chain + 1) * width], history,
                                  drafts[chain])
            base[chain] = sample.first_output + len(history) - 1  # (its fed token's position)
            min_tokens = sample.adjuster.params.min_tokens
            inside += 0 < min_tokens - len(history) < width
            rows.append(AdjustedRow(chain, slot, sample, sample.adjuster, list(sample.output),
                                    j if fed_token else None, mark if chained else None,
                                    sample.first_output))
        got = logits.clone()
        adjusted = state.apply_chains(
            got, rows, torch.tensor(drafts, device=device).view(num_chains, width - 1),
            torch.tensor(fed, dtype=torch.long, device=device) if fed_token else None,
            torch.tensor(base, device=device))
        assert torch.equal(got, expected), f"step {step} ({modes[-1]})"
        assert torch.equal(got.signbit(), expected.signbit()), f"step {step}"
        # verification keeps each chain's first accepted + 1 tokens
        tokens = [[rng.randrange(VOCAB) for _ in range(width)] for _ in range(num_chains)]
        accepted = [rng.randrange(width) for _ in range(num_chains)]
        adjusted.count(torch.tensor(tokens, device=device),
                       torch.tensor(accepted, device=device))
        for slot, chain in zip(order, where, strict=True):
            sample = slots[slot]
            if fed_token:  # (the token in flight: committed now, the chain's kept behind it)
                sample.output += sample.kept
            sample.kept = (sample.kept if chained else []) + tokens[chain][:accepted[chain] + 1]
        mark = adjusted.mark
    assert {"chained", "host", "fed"} <= set(modes) and inside > 0


@pytest.mark.parametrize("device", DEVICES)
def test_a_plain_step_fed_from_chains_masks_min_tokens_by_its_position(device):
    """A plain step fed from a drafting flight's chains (``apply`` with ``base``): the host's
    output lacks the tokens the flight kept, so a ``min_tokens`` is masked by where each row's
    fed token sits on the device; bit for bit against each sample's adjuster over its whole
    history, at and around the last masked position, rows of other samples left as they are.
    By the host's count alone the rows would differ (checked)."""
    rng = random.Random(4)
    gen = torch.Generator().manual_seed(4)
    state = SlotAdjustments(VOCAB, torch.device(device),
                            lambda a: torch.from_numpy(np.asarray(a, dtype=np.int64)).to(device))
    params = [dict(min_tokens=3, stop_token_ids=[5]), dict(min_tokens=5, logit_bias={1: 4.0}),
              dict(min_tokens=4, bad_words=["w7"]), dict(logit_bias={3: 2.0})]
    samples = []
    for i, kwargs in enumerate(params):
        prompt = [rng.randrange(VOCAB) for _ in range(2 + i)]
        samples.append((len(prompt), LogitsAdjuster(SamplingParams(**kwargs), prompt,
                                                    frozenset({EOS_ID}), TOK)))
    differs = 0  # (rows the host's count alone would mask otherwise)
    for step in range(30):
        extra = rng.choice([0, 2])
        num_rows = len(samples) + extra
        where = rng.sample(range(num_rows), len(samples))
        logits = (torch.randn(num_rows, VOCAB, generator=gen) * 3).to(device)
        logits[:, EOS_ID] = 9.0
        expected, by_host, rows = logits.clone(), logits.clone(), []
        base = [rng.randrange(100) for _ in range(num_rows)]  # (others' rows: anywhere)
        for slot, ((first_output, adjuster), row) in enumerate(zip(samples, where,
                                                                   strict=True)):
            output = [rng.randrange(VOCAB) for _ in range(rng.randrange(0, 6))]  # (host's)
            kept = [rng.randrange(VOCAB) for _ in range(rng.randrange(1, 4))]  # (device's)
            history = output + kept
            adjuster.apply(expected[row:row + 1], history)
            adjuster.apply(by_host[row:row + 1], output)
            base[row] = first_output + len(history) - 1  # (its fed token: the last kept)
            rows.append(AdjustedRow(row, slot, adjuster, adjuster, output, None, None,
                                    first_output))
        got = logits.clone()
        state.apply(got, rows, base=torch.tensor(base, device=device))
        assert torch.equal(got, expected), f"step {step}"
        differs += not torch.equal(by_host, expected)
    assert differs > 0


def test_chains_refuse_counts_they_cannot_trust():
    """A chain (or a plain step) fed from chains whose counts the slot does not hold, and a
    sample whose min_tokens may still be ahead without its chain's position: ValueError,
    nothing adjusted."""
    state = SlotAdjustments(VOCAB, torch.device("cpu"), lambda a: torch.from_numpy(
        np.asarray(a, dtype=np.int64)))
    rng = random.Random(0)
    sample = Sample(0, rng)  # (a repetition penalty)
    logits = torch.randn(3, VOCAB)
    drafts = torch.tensor([[1, 2]])
    row = AdjustedRow(0, 0, sample, sample.adjuster, [], None, object())
    with pytest.raises(ValueError, match="not those of the chain"):
        state.apply_chains(logits.clone(), [row], drafts)
    with pytest.raises(ValueError, match="not those of the chain"):  # (a plain step's too)
        state.apply(logits[:1].clone(), [row])
    short = Sample(6, rng)  # (min_tokens=5: masked by where its chain sits, so it needs that)
    with pytest.raises(ValueError, match="min_tokens=5 with 0 output tokens needs"):
        state.apply_chains(logits.clone(), [AdjustedRow(0, 1, short, short.adjuster, [])],
                           drafts)
