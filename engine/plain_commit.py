"""A plain flight's commit in one pass: every sequence of the step sampled one token, without
drafts (the overlapped path's common step, :mod:`engine.overlap`).

Why. The general commit (``LLMEngine._commit``) walks each sequence through a verification
record, the stop checks a token at a time, the accounting and the cache's rollback: about 9 µs a
sequence on a 2-core CPU, 0.2-0.3 ms a step at batch 32, on the critical path of a step whose
kernels take about a millisecond. Here one pass does each sequence's stop check
(:func:`engine.stop_checker.fact_stop`, from facts it took from its parameters once), its
append, its counters and its cached length. A sequence with stop strings or stop token ids
takes the general rules for its one token; a failed row finishes its sequence.

Why not numpy: gathering each sequence's counts and facts into arrays costs more than the
check. On this project's 2-core CPU the stop decision of 32 sequences took 23.8 µs through
numpy against 6.6 µs in Python (256: 126 against 52 µs). Arrays pay only once the per-slot
state lives in them across steps.

What it changes is the general commit's, token for token: the same tokens kept, the same finish
and stop reasons and text, the same counters, the same cached lengths (tests/engine/
test_plain_commit.py compares the two on random batches).
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.sequence import Sequence
from engine.stop_checker import EOS_STOP, append_until_stop, fact_stop
from scheduler import SequenceStatus

FAILED_ROW = ("non-finite target logits (NaN/inf) or a draft id outside the vocabulary at "
              "verification")
FINISHED = SequenceStatus.FINISHED


@dataclass(frozen=True)
class PlainCommit:
    """What a plain flight's commit did: the sequences that got their token or finished
    (``updated``, in the flight's order; those aborted in flight are left out), those that
    finished (the engine releases them), the cache rows each running sequence keeps
    (``(slot, num_rows)``, for ``ModelRunner.truncate``) and the tokens kept in all."""

    updated: list[Sequence]
    finished: list[Sequence]
    truncations: list[tuple[int, int]]
    num_kept: int


def commit_plain(seqs: list[Sequence], token_ids: list[int], failed: set[int],
                 eos_token_ids: frozenset[int], max_model_len: int, now: float,
                 ahead: dict[int, int]) -> PlainCommit:
    """Append ``token_ids`` (the flight's sampled tokens, one a sequence; a negative one is a
    row the kernels marked invalid) with the stop checks; rows ``failed`` (the host found them
    unusable) and invalid ones finish their sequence with an error. A running sequence's newest
    token stays uncached; its rows past that go back, except for the sequences ``ahead`` (id ->
    the next flight's width: 0 when it feeds them plainly, or the rows it reserved past the
    newest token) whose newest token the next flight is writing."""
    updated, finished, truncations, num_kept = [], [], [], 0
    for j, (seq, token) in enumerate(zip(seqs, token_ids, strict=True)):
        if seq.status is FINISHED:  # (aborted in flight: nothing)
            continue
        updated.append(seq)
        before = len(seq.all_token_ids)
        if token < 0 or j in failed:
            seq.finish("error", error=FAILED_ROW)
        else:
            facts = seq.stop_facts
            if facts is None:  # (stop strings or stop token ids: the general rules)
                append_until_stop(seq, [token], eos_token_ids, max_model_len)
            else:
                stop = fact_stop(facts, token, len(seq.output_token_ids) + 1, before + 1,
                                 eos_token_ids, max_model_len)
                seq.append_token(token, with_text=not (
                    stop == EOS_STOP and not seq.params.include_stop_str_in_output))
                if stop:
                    seq.finish("stop" if stop == EOS_STOP else "length")
            num_kept += 1  # (one token: the stopping one is kept too)
            metrics = seq.metrics
            metrics.num_steps += 1
            metrics.num_generated += 1
            if metrics.first_token_time is None:
                metrics.first_token_time = now
            if seq.status is FINISHED:
                metrics.finished_time = now
        # (the new token is fed next, uncached; a finished one's rows are its context)
        seq.num_computed_tokens = before
        if seq.status is FINISHED:
            finished.append(seq)
            continue
        width = ahead.get(id(seq))
        if width is None:
            truncations.append((seq.slot, before))
        elif width:  # (a flight fed from chains reserved rows past its own)
            truncations.append((seq.slot, before + width))
    return PlainCommit(updated, finished, truncations, num_kept)
