"""A flight's commit in one pass (the overlapped path's steps, :mod:`engine.overlap`): a plain
flight (every sequence sampled one token, no drafts) or a drafting flight (every sequence
verified a chain of ``k`` drafts on the device: its accepted drafts and one recovered or bonus
token).

Why. The general commit (``LLMEngine._commit``) walks each sequence through a verification
record, the stop checks a token at a time, the accounting and the cache's rollback in separate
passes: about 9 µs a sequence on a 2-core CPU, 0.2-0.3 ms a plain step at batch 32, on the
critical path of a step whose kernels take about a millisecond. Here one pass does each
sequence's stop checks (:func:`engine.stop_checker.fact_stop`, from facts it took from its
parameters once), its appends, its counters and its cached length. A sequence with stop strings
or stop token ids takes the general rules for its tokens (``append_until_stop``); a failed row
finishes its sequence.

Why not numpy: gathering each sequence's counts and facts into arrays costs more than the
check. On this project's 2-core CPU the stop decision of 32 sequences took 23.8 µs through
numpy against 6.6 µs in Python (256: 126 against 52 µs). Arrays pay only once the per-slot
state lives in them across steps.

A sequence whose tokens cannot stop it (each before ``min_tokens``, or none a stopping EOS
and the last within both lengths) appends them at once (``Sequence.extend_tokens``), and a
drafting flight's metrics are counted in one call (``MetricsCollector.record_request_steps``)
(docs/design.md, "Measured reasons behind the runner's choices").

What it changes is the general commit's, token for token: the same tokens kept, the same finish
and stop reasons and text, the same counters and metrics, the same cached lengths, the same
proposer calls (tests/engine/test_flight_commit.py compares the two on random batches).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from engine.metrics import MetricsCollector
from engine.sequence import Sequence
from engine.stop_checker import EOS_STOP, append_until_stop, fact_stop
from samplers import INVALID_TOKEN_ID, PLACEHOLDER_TOKEN_ID
from scheduler import SequenceStatus

FAILED_ROW = ("non-finite target logits (NaN/inf) or a draft id outside the vocabulary at "
              "verification")
FINISHED = SequenceStatus.FINISHED


@dataclass
class FlightCommit:
    """What a flight's commit did: the sequences that got tokens or finished (``updated``, in
    the flight's order; those aborted in flight are left out), those that finished (the engine
    releases them), the cache rows each running sequence keeps (``(slot, num_rows)``, for
    ``ModelRunner.truncate``) and the tokens kept in all; for a drafting flight, each
    verified (not failed) sequence's flight row and accepted drafts (``verified``: what the
    controller learns and the proposer is told)."""

    updated: list[Sequence] = field(default_factory=list)
    finished: list[Sequence] = field(default_factory=list)
    truncations: list[tuple[int, int]] = field(default_factory=list)
    num_kept: int = 0
    verified: list[tuple[int, int]] = field(default_factory=list)  # (row, accepted)


def append_tokens(seq: Sequence, tokens: list[int], eos_token_ids: frozenset[int],
                  max_model_len: int) -> int:
    """``append_until_stop``'s effect (the tokens kept: up to the one that stops the sample),
    from the sequence's ``stop_facts`` where it has them."""
    facts = seq.stop_facts
    if facts is None:  # (stop strings or stop token ids: the general rules)
        return append_until_stop(seq, tokens, eos_token_ids, max_model_len)
    num_output, num_total = len(seq.output_token_ids), len(seq.all_token_ids)
    n = len(tokens)
    if num_output + n < facts[0] or (
            num_output + n < facts[1] and num_total + n < max_model_len
            and (not facts[2] or eos_token_ids.isdisjoint(tokens))):
        # (no token can stop it: each is before min_tokens, or none is a stopping EOS and the
        # last stays within both lengths; fact_stop answers 0 for every one)
        seq.extend_tokens(tokens)
        return n
    for count, token in enumerate(tokens, start=1):
        stop = fact_stop(facts, token, num_output + count, num_total + count, eos_token_ids,
                         max_model_len)
        seq.append_token(token, with_text=not (
            stop == EOS_STOP and not seq.params.include_stop_str_in_output))
        if stop:
            seq.finish("stop" if stop == EOS_STOP else "length")
            return count
    return len(tokens)


def commit_plain(seqs: list[Sequence], token_ids: list[int], failed: set[int],
                 eos_token_ids: frozenset[int], max_model_len: int, now: float,
                 ahead: dict[int, int], metrics: MetricsCollector,
                 on_kept: Callable[[Sequence, int, list[int]], None]) -> FlightCommit:
    """Append ``token_ids`` (the flight's sampled tokens, one a sequence; a negative one is a
    row the kernels marked invalid) with the stop checks; rows ``failed`` (the host found them
    unusable) and invalid ones finish their sequence with an error. A sequence that kept its
    token is handed it (``on_kept(seq, row, tokens)``: its grammar accepts it, which may finish
    it; its logprobs), before its counters. A running sequence's newest token stays uncached;
    its rows past that go back, except for the sequences ``ahead`` (id -> the next flight's width: 0
    when it feeds them plainly, or the rows it reserved past the newest token) whose newest
    token the next flight is writing."""
    done = FlightCommit()
    for j, (seq, token) in enumerate(zip(seqs, token_ids, strict=True)):
        if seq.status is FINISHED:  # (aborted in flight, or stopped a flight before: nothing)
            continue
        before = len(seq.all_token_ids)
        if token < 0 or j in failed:
            seq.finish("error", error=FAILED_ROW)
        else:
            kept = append_tokens(seq, [token], eos_token_ids, max_model_len)
            on_kept(seq, j, [token][:kept])
            done.num_kept += kept
            account(seq, 0, 0, kept, now)
        _keep_rows(seq, before, 0, ahead, done)
    metrics.record_appended(done.num_kept)
    return done


def commit_chains(seqs: list[Sequence], rows: list[list[int]], k: int, failed: set[int],
                  eos_token_ids: frozenset[int], max_model_len: int, now: float,
                  ahead: dict[int, int], metrics: MetricsCollector,
                  on_accepted: Callable[[str, int], None] | None,
                  on_kept: Callable[[Sequence, int, list[int]], None] | None = None
                  ) -> FlightCommit:
    """:func:`commit_plain` for a drafting flight: ``rows[j]`` is sequence ``j``'s row of
    ``k + 1`` tokens (its accepted drafts, its recovered or bonus token, then placeholders; a
    row starting with ``INVALID_TOKEN_ID`` failed). A sequence that kept tokens is handed them
    (``on_kept(seq, j * (k + 1), tokens)``, its chain's first flight row: their logprobs). A
    sequence that goes on without the next flight tells the proposer its accepted context
    (``on_accepted(seq_id, num_tokens)``)."""
    done = FlightCommit()
    accepted_all: list[int] = []  # (each verified sequence's accepted drafts: its metrics)
    for j, (seq, row) in enumerate(zip(seqs, rows, strict=True)):
        if seq.status is FINISHED:  # (aborted in flight: nothing)
            continue
        before = len(seq.all_token_ids)
        tokens = [t for t in row if t != PLACEHOLDER_TOKEN_ID]
        accepted = len(tokens) - 1
        if j in failed or tokens[0] == INVALID_TOKEN_ID:
            seq.finish("error", error=FAILED_ROW)
            kept = 0
        else:
            kept = append_tokens(seq, tokens, eos_token_ids, max_model_len)
            if on_kept is not None:
                on_kept(seq, j * (k + 1), tokens[:kept])
            done.num_kept += kept
            done.verified.append((j, accepted))
            account(seq, k, accepted, kept, now)
            accepted_all.append(accepted)
        _keep_rows(seq, before, min(accepted, kept), ahead, done)
        if (on_accepted is not None and seq.status is not FINISHED
                and id(seq) not in ahead):
            on_accepted(seq.seq_id, before + min(accepted, kept))
    if k:
        metrics.record_request_steps(k, accepted_all, done.num_kept)
    else:  # (a flight of no drafts: its tokens as a plain flight's)
        metrics.record_appended(done.num_kept)
    return done


def account(seq: Sequence, drafted: int, accepted: int, kept: int, now: float) -> None:
    """A sequence's counters for one verified step: ``drafted`` drafts (a tree's levels and
    forced drafts count), ``accepted`` of them, ``kept`` tokens after the stop checks, at
    ``now``. Every commit (a flight's, ``LLMEngine._commit``) counts through this."""
    m = seq.metrics
    m.num_drafted += drafted
    m.num_accepted += accepted
    m.num_steps += 1
    m.num_generated += kept
    if m.first_token_time is None:
        m.first_token_time = now
    if seq.status is FINISHED:
        m.finished_time = now


def _keep_rows(seq: Sequence, before: int, kept_drafts: int, ahead: dict[int, int],
               done: FlightCommit) -> None:
    """The sequence's cached length after its step (``LLMEngine._rollback``'s rule) and its
    place in ``done``: a finished one keeps the context it was fed on and the drafts it kept;
    a running one all but its newest token, which is fed next (by the flight in flight for
    those ``ahead``, whose rows it reserved stay)."""
    done.updated.append(seq)
    if seq.status is FINISHED:
        seq.num_computed_tokens = before + kept_drafts
        done.finished.append(seq)
        return
    seq.num_computed_tokens = len(seq.all_token_ids) - 1
    width = ahead.get(id(seq))
    if width is None:
        done.truncations.append((seq.slot, seq.num_computed_tokens))
    elif width:  # (a flight fed from chains reserved rows past its own)
        done.truncations.append((seq.slot, seq.num_computed_tokens + width))
