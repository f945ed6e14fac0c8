"""Overlapped steps (``EngineConfig.async_scheduling``): step n + 1 is launched before step n's
tokens come back to the host, then step n is committed while the GPU runs step n + 1.

A step whose sampling sequences all decode plainly (no drafts, no grammar, no bad word of
several tokens: :func:`samples_ahead`) samples *ahead*: its tokens stay on the device
(:class:`InFlight`), copied to pinned host memory behind the forward. If the next step is the
same sequences decoding again (:func:`next_sequences`: nobody waiting who could be admitted, i.e.
no request waits or every slot is taken; every running sequence in the flight, KV rows for one
more token each), it is launched at once, its input ids taken from
the flight's tokens on the device (``engine.runner.FedTokens``); only then does the host wait
for step n's tokens and append them (stop checks, detokenisation, streaming, metrics) while the
GPU computes step n + 1. A sequence that stopped at step n has one token too many in step
n + 1: it is dropped when that step commits, and its slot (the extra row with it) was freed when
it finished. Sequences that certainly stop at step n (their length limit) are left out of step
n + 1. Output is the synchronous step's: greedy tokens and seeded samples (keyed by output
position, not by step) are the same; unseeded samples draw the same distribution.

Penalties, bias, allowed ids, one-token bad words and min_tokens are applied on the device
from each slot's state, whose output counts the sampled tokens raise there
(:mod:`samplers.slot_adjustments`: a drafting flight's chains too, each row counting the drafts
before it, the verified tokens raising the counts); logprobs are gathered on the device with
the sampling and copied behind the tokens (:class:`FlightLogprobs`).

**Steps whose logits need the host** (a grammar's mask, a bad word of several tokens) overlap
by halves: step n + 1's forward is launched
from step n's tokens on the device (:class:`Pending`), step n is committed (the grammars accept
its tokens), then the host masks and adjusts step n + 1's logits and the device samples them,
all while that forward runs. A grammar that forces tokens (``structured_forced_tokens``) ends
the overlap only when every sample of the step is forced three tokens or more: the flight takes
the first, and the synchronous step after it drafts the rest, several tokens a forward.

**Drafting steps** overlap too where the proposer drafts on the device
(``Proposer.drafts_on_device``: a draft head's chains, a draft model's argmax drafts): a
verification step that is all chains of one width ``k + 1`` verifies on the device (seeded
requests keyed at output positions moved on there, ``SamplingTensors.advanced``), and the
proposer drafts the next step's ``k`` drafts there from the verified tokens (and the forward's
features, for a head: ``Proposer.draft_after``). The next step is launched from them
(``engine.runner.FedChains``): sequence ``b`` feeds its recovered or bonus token and the new
drafts at positions ``base[b] + accepted[b] + 1 ...``, computed on the device, into KV rows the
runner reserved for the most it can advance. When that step is committed the rows past what
its successor writes go back, and the proposer learns where each sequence got
(``Proposer.advance``). Logprobs are gathered for every row of the chains of the sequences
that ask, and the commit reads those of the tokens it keeps (:class:`FlightLogprobs`).

Vocabulary: a *flight* is a launched step whose tokens the host has not read yet.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch

from engine.logprobs import PositionLogprobs, entries_of, logprob_facts
from engine.sequence import Sequence
from engine.step_records import Forwarded
from samplers import SamplingTensors


def samples_ahead(seq: Sequence) -> bool:
    """A sequence whose plain step can be sampled, or whose drafts a drafting flight can
    verify, before the host has committed the step before: no grammar mask, no bad word of
    several tokens (those read its newest tokens on the host). Its other adjustments come from
    its slot's state on the device (:mod:`samplers.slot_adjustments`: a chain row's counts
    with the chain's drafts before it, and a ``min_tokens`` still ahead masked by where the
    chain sits), its logprobs are gathered there (:class:`FlightLogprobs`)."""
    return seq.grammar is None and not seq.adjuster.needs_history


class FlightLogprobs:
    """A flight's logprobs for the rows that ask for them (:func:`engine.logprobs.logprob_facts`
    of their values, made on the device when the flight was sampled) on their way to the host
    behind the flight's tokens: ``rows`` (the flight's rows), ``values [n, 1 + k]`` (the chosen
    token's value, then the ``k`` best) and ``ranks_ids [n, 1 + k]`` (its rank, then their
    ids), and the event marking their copy (None: already on the host)."""

    def __init__(self, rows: list[int], values: torch.Tensor, ranks_ids: torch.Tensor) -> None:
        self.rows = {row: i for i, row in enumerate(rows)}
        self.copied: torch.cuda.Event | None = None
        device = values.device
        if device.type == "cuda":  # (pinned, so the copies do not wait for the queue)
            host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                    for t in (values, ranks_ids)]
            for h, t in zip(host, (values, ranks_ids), strict=True):
                h.copy_(t, non_blocking=True)
            values, ranks_ids = host
            self.copied = torch.cuda.Event()
            self.copied.record(torch.cuda.current_stream(device))
        self._values, self._ranks_ids = values, ranks_ids
        self._lists: tuple[list, list] | None = None

    @classmethod
    def of(cls, rows: list[int], values: torch.Tensor, tokens: torch.Tensor,
           k: int) -> FlightLogprobs:
        """From ``values [len(rows), vocab_size]`` and the sampled ``tokens [len(rows)]`` on the
        device (a row marked invalid or a chain's placeholder, negative, gets an entry that is
        never used)."""
        chosen, ranks, top_values, top_ids = logprob_facts(values, tokens.clamp_min(0), k)
        return cls(rows, torch.cat([chosen[:, None], top_values], dim=1),
                   torch.cat([ranks[:, None], top_ids], dim=1))

    def entries(self, first: int, tokens: list[int], top_n: int,
                tokenizer) -> list[PositionLogprobs]:
        """The entries of ``tokens`` at flight rows ``first, first + 1, ...`` (their chosen
        tokens; each with its ``top_n`` best): a plain flight's one token, a drafting flight's
        kept ones in its chain's rows (waits for the copy the first time)."""
        if self._lists is None:
            if self.copied is not None:
                self.copied.synchronize()
            self._lists = self._values.tolist(), self._ranks_ids.tolist()
        at = [self.rows[first + i] for i in range(len(tokens))]
        values, ranks_ids = [self._lists[0][i] for i in at], [self._lists[1][i] for i in at]
        return entries_of([v[0] for v in values], [r[0] for r in ranks_ids],
                          [v[1:1 + top_n] for v in values], [r[1:1 + top_n] for r in ranks_ids],
                          tokens, tokenizer)


class TokenCopies:
    """A flight's sampled tokens ``[n]`` to the host behind the work queued before them:
    two pinned buffers used in turn (step n's is read while step n + 1's copy is queued), each
    with the event that marks its copy's end. Off CUDA the tokens are already on the host."""

    def __init__(self, device: torch.device, size: int) -> None:
        self._device = device
        self._pinned = device.type == "cuda"
        self._buffers = [torch.empty(size, dtype=torch.long, pin_memory=self._pinned)
                         for _ in range(2)]
        # (timing events: a flight's device time is read off its launch and copy events)
        self._events = [torch.cuda.Event(enable_timing=True) if self._pinned else None
                        for _ in range(2)]
        self._turn = 0

    def start(self, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.cuda.Event | None]:
        """Queue the copy of ``tokens [n]``; returns (the host tensor, its event)."""
        if not self._pinned:
            return tokens, None
        buffer = self._buffers[self._turn][:tokens.numel()]
        event = self._events[self._turn]
        self._turn ^= 1
        buffer.copy_(tokens, non_blocking=True)
        event.record(torch.cuda.current_stream(self._device))  # (the copy's device, not cuda:0)
        return buffer, event


@dataclass
class InFlight:
    """A launched step whose tokens are on their way to the host: its forward (a plain
    flight's items sample one token each; a drafting flight's verify ``width - 1`` drafts
    each), its tokens on the device (``[len(items)]``, or ``[len(items), width]``), their host
    copy and its event (None: already there), the rows found unusable on the host (CPU only:
    on CUDA the kernels mark them ``INVALID_TOKEN_ID``), the controller's step number,
    whether it was launched ahead (by the call before the one that commits it), and an event
    recorded before its forward (CUDA, launched ahead)."""

    forwarded: Forwarded
    tokens: torch.Tensor
    host: torch.Tensor
    copied: torch.cuda.Event | None
    failed: set[int]
    plan_step: int
    ahead: bool = False
    began: torch.cuda.Event | None = None  # recorded before its forward was queued (CUDA)
    # a drafting flight: tokens a sequence (``tokens [batch, width]``: accepted drafts, the
    # recovered or bonus token, placeholders), the next flight's fed tokens and positions
    # ``([batch, width], [batch])`` on the device, and the features its drafts came from
    width: int = 1
    chain: tuple[torch.Tensor, torch.Tensor] | None = None
    features: torch.Tensor | None = None
    # the next flight's sampling tensors (keyed positions moved on; None: all greedy)
    sampling: SamplingTensors | None = None
    # launched from chains (``FedChains``): its rows were reserved for the most the flight
    # before it could advance, and go back past its own when that flight commits
    reserved: bool = False
    # a plain step launched from a plain flight: its launch wrote that flight's pairs into the
    # draft head's cache on the device, for this step's sequences (``Proposer.write_after``)
    pairs_written: bool = False

    # the flight's logprobs for the rows that asked for them (their facts on the way; a
    # drafting flight's: every row of the chains of the sequences that asked)
    logprobs: FlightLogprobs | None = None
    # the step after it runs from the host: a grammar of its sequences forces tokens there,
    # which the synchronous step drafts (``EngineConfig.structured_forced_tokens``)
    host_next: bool = False
    # a drafting flight's mark of its penalized sequences' counts (``AdjustedChains.mark``:
    # what their slots hold once its kept tokens are counted on the device; None: none)
    counted: object = None

    def device_seconds(self) -> float | None:
        """The flight's time on the device, from its forward's start to its tokens' copy
        (after :meth:`token_ids`; None off CUDA or without a start event): what a plain step
        costs when steps overlap, the device being their bottleneck."""
        if self.began is None or self.copied is None:
            return None
        return self.began.elapsed_time(self.copied) / 1e3

    def token_ids(self) -> list[int]:
        """The sampled tokens, one per item (waits for their copy)."""
        if self.copied is not None:
            self.copied.synchronize()
        return self.host.tolist()

    def token_rows(self) -> list[list[int]]:
        """A drafting flight's tokens, one row of ``width`` a sequence (waits for their copy)."""
        flat = self.token_ids()
        return [flat[i:i + self.width] for i in range(0, len(flat), self.width)]

    def rows_of(self, seqs: list[Sequence]) -> list[int]:
        """Each of ``seqs``' row in the flight (its index among the flight's sequences)."""
        row = {id(seq): j for j, seq in enumerate(self.sequences)}
        return [row[id(seq)] for seq in seqs]

    @property
    def sequences(self) -> list[Sequence]:
        return [item.seq for item in self.forwarded.items]


@dataclass
class Pending:
    """A plain step launched before the flight before it was committed, whose sampling waits
    for that commit (its sequences' logits need what the host learns there: not
    :func:`samples_ahead`). It is sampled right after the commit, while its forward runs, and
    becomes a flight (``OverlappedSteps._sample_hosted``). Its forward, the controller's step
    number, the event recorded before its forward (CUDA), and whether its launch wrote the
    flight before's pairs into the draft head's cache (as :attr:`InFlight.pairs_written`)."""

    forwarded: Forwarded
    plan_step: int
    began: torch.cuda.Event | None = None
    pairs_written: bool = False
    # (what the engine reads of the step in flight, as :class:`InFlight`'s: one token a
    # sequence, fed plainly)
    width = 1
    chain = None
    reserved = False

    @property
    def sequences(self) -> list[Sequence]:
        return [item.seq for item in self.forwarded.items]


def next_sequences(flight: InFlight, running: Iterable[Sequence], admissible: bool,
                   free_kv_tokens: int, max_model_len: int) -> list[Sequence] | None:
    """The sequences of the step after ``flight`` when it can be launched before the flight's
    tokens are read (None: it cannot; the engine then schedules from the host as usual):
    nobody waiting could be admitted now (``admissible``: a request waits and a slot is free;
    with every slot taken a waiting request is admitted by the step after a sequence
    finishes, which the commit finds), every running sequence is in the flight, and the KV cache has
    rows for each one's next tokens (a drafting flight's successor reserves ``width`` more
    rows a sequence: the most it can advance). Sequences whose flight certainly ends them
    (its first token reaches ``max_tokens``) or whose next step could pass ``max_model_len``
    are left out; an empty list is None."""
    seqs = flight.sequences
    if admissible:
        return None
    ids = {id(seq) for seq in seqs}
    if any(id(seq) not in ids for seq in running):
        return None
    nxt = [seq for seq in seqs
           if not seq.is_finished and not _ends_by_length(seq, flight.width, max_model_len)]
    if not nxt or len(nxt) * flight.width > free_kv_tokens:
        return None
    return nxt


def _ends_by_length(seq: Sequence, width: int, max_model_len: int) -> bool:
    """The flight's first token (output token ``num_output_tokens + 1``) reaches
    ``max_tokens``, or the step after it could write past ``max_model_len`` (positions up to
    ``num_tokens - 1 + 2 * width - 1``: the flight's ``width`` tokens, then as many)."""
    max_tokens = seq.params.max_tokens
    return ((max_tokens is not None and seq.num_output_tokens + 1 >= max_tokens)
            or seq.num_tokens + 2 * width - 1 >= max_model_len)
