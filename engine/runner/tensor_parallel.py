"""Tensor parallelism: one process per GPU (``torchrun --nproc-per-node N``), one rank decides.

The target is loaded with transformers' own tensor-parallel plan (``tp_plan="auto"``: the
model's ``base_model_tp_plan`` splits the attention heads and the MLP columns over the ranks, and
the output head gathers the logits), so every rank holds ``1 / N`` of each decoder layer's
weights and, in its own :class:`~engine.runner.model_runner.ModelRunner`, the KV pools of its
``num_key_value_heads / N`` heads. The default process group (NCCL on CUDA, gloo on CPU) carries
the model's collectives; a second, gloo group carries the control messages below.

Who decides. Rank 0 builds the whole engine (scheduler, proposer, sampler, RNG) and is the only
rank that reads logits. Its runner is a :class:`LeaderRunner`: every call that changes runner
state (a slot taken or freed, a rollback, a forward) runs locally and is recorded. A forward,
once its arguments are checked and its CUDA graph decision made and before the device runs any
of it, sends the calls recorded since the last forward, then its own arguments and that
decision, in one broadcast (:func:`broadcast`: one message per step). The other ranks
run :func:`follow`: they receive each message and replay it on their runner in the same order,
so their slot tables, pool rows and forwards are the leader's by construction and no rank can
diverge. A forward that the leader refuses (``KVCacheFull``, a bad argument) is refused before
it is sent, so the followers never see it. At interpreter exit (or
:meth:`LeaderRunner.shutdown`) the leader sends a stop message and the followers return.

CUDA graphs. A captured graph holds the model's collectives, so every rank must capture and
replay the same buckets at the same steps; the graph decisions read each rank's own timings and
free memory, so a follower does not make its own: it runs the bucket the leader chose and
captures what the leader captured (``CudaGraphs.dictate``). The lm head's gather of the logits
runs after the replay, eagerly, on every rank: an eager collective right after a replayed one on
the same communicator, which NCCL supports with its graph mixing support, the default (NCCL's
CUDA-graph guide: outstanding operations in any mix of captured and uncaptured are supported),
so ``NCCL_GRAPH_MIXING_SUPPORT=0``, which transformers sets for its own batching, is not set
here. ``enforce_eager=True`` runs every step eager.
"""

from __future__ import annotations

import atexit
import gc
import os
import pickle
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from engine.runner.cuda_graphs import Decision
from engine.runner.forward_output import ForwardOutput
from engine.runner.model_runner import ModelRunner
from engine.runner.step_layout import Tree

__all__ = ["LeaderRunner", "agreed_minimum", "check_launch", "follow", "lead_or_follow",
           "whole_copies"]

# A message: the calls a follower replays, in order, as (method name, positional arguments).
Calls = list[tuple[str, tuple]]
STOP = "stop"
_MUTATING = ("allocate_slot", "free_slot", "truncate", "keep_paths", "attach_prefix")

_GROUP: list[Any] = []  # the control group, made once per process
MESSAGE_BYTES = 16384  # broadcast()'s fixed buffer: one step's message fits
_BUFFER: list[torch.Tensor] = []  # [MESSAGE_BYTES] uint8, made once per process


def check_launch(size: int) -> None:
    """Raise ValueError unless this process was started by ``torchrun --nproc-per-node size``."""
    world = os.environ.get("WORLD_SIZE")
    if world is None or "RANK" not in os.environ:
        raise ValueError(f"tensor_parallel_size={size} needs one process per GPU: launch with "
                         f"torchrun --nproc-per-node {size} (WORLD_SIZE is not set)")
    if int(world) != size:
        raise ValueError(f"tensor_parallel_size={size} but torchrun started WORLD_SIZE={world} "
                         "processes; they must be equal")


def control_group() -> Any:
    """The gloo group that carries control messages (the default group may be NCCL, which only
    moves device tensors)."""
    if not _GROUP:
        _GROUP.append(dist.new_group(backend="gloo"))
    return _GROUP[0]


def broadcast(value: Any = None) -> Any:
    """Rank 0's ``value`` (picklable) on every rank of the control group: in one broadcast of a
    fixed buffer when it pickles to at most ``MESSAGE_BYTES - 8`` bytes (a step's message at any
    batch this engine runs), else a second one of its size. ``broadcast_object_list`` sends the
    size and the bytes apart, always two: 530 against 220 us a message on rank 0 with two gloo
    processes on this project's 2-core CPU (on the leader's critical path every step)."""
    leader = dist.get_rank() == 0
    if not _BUFFER:
        with torch.inference_mode(False):  # (written in and out of inference mode)
            _BUFFER.append(torch.zeros(MESSAGE_BYTES, dtype=torch.uint8))
    buffer = _BUFFER[0]  # [MESSAGE_BYTES] uint8: the payload's size (int64), then the payload
    if leader:
        data = pickle.dumps(value, protocol=pickle.HIGHEST_PROTOCOL)
        buffer[:8].view(torch.int64)[0] = len(data)
        if len(data) <= MESSAGE_BYTES - 8:
            buffer[8:8 + len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    dist.broadcast(buffer, src=0, group=control_group())
    size = int(buffer[:8].view(torch.int64)[0])
    if size <= MESSAGE_BYTES - 8:
        payload = buffer[8:8 + size]  # [size] uint8
    else:  # (a second broadcast, of the payload's size)
        payload = (torch.frombuffer(bytearray(data), dtype=torch.uint8) if leader
                   else torch.empty(size, dtype=torch.uint8))
        dist.broadcast(payload, src=0, group=control_group())
    if leader:
        return value
    return pickle.loads(payload.numpy().tobytes())


def agreed_minimum(value: int) -> int:
    """The smallest of every rank's ``value`` (a KV budget each rank measured on its own GPU)."""
    values: list[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(values, value, group=control_group())
    return min(values)


def whole_copies(model: nn.Module) -> tuple[nn.Module | None, nn.Module | None]:
    """Rank 0's plain, unsplit copies of the model's input embedding and output head, gathered
    from the ranks' shares (a collective: every rank calls it, in the same order; the other
    ranks get None and free what they gathered). A draft head reads through them on rank 0
    alone: the split modules' own forwards are collectives that the other ranks would never
    join (two gloo ranks hung at the first proposal). A weight split by rows is a
    DTensor under transformers' DTensor plans (gathered whole), or, under earlier releases,
    this rank's equal share of the rows (gathered in rank order). Tied weights stay one copy."""
    config = model.config
    embed, head = model.get_input_embeddings(), model.get_output_embeddings()
    embed_weight = _whole("input embedding", embed.weight, config)
    head_weight = embed_weight if head.weight is embed.weight else _whole(
        "output head", head.weight, config)
    bias = getattr(head, "bias", None)
    bias = None if bias is None else _whole("output head's bias", bias, config)
    if dist.get_rank() != 0:
        del embed_weight, head_weight, bias
        if torch.cuda.is_available():
            torch.cuda.empty_cache()  # (before this rank's KV budget is measured)
        return None, None
    whole_embed = nn.Embedding.from_pretrained(embed_weight, freeze=True)  # (no copy)
    whole_head = nn.Linear(head_weight.shape[1], head_weight.shape[0], bias=bias is not None,
                           device="meta")
    whole_head.weight = nn.Parameter(head_weight, requires_grad=False)
    if bias is not None:
        whole_head.bias = nn.Parameter(bias, requires_grad=False)
    return whole_embed.eval(), whole_head.eval()


def _whole(name: str, tensor: torch.Tensor, config: Any) -> torch.Tensor:
    """``tensor`` (rows by vocabulary entry) with all its rows: a DTensor's full tensor, equal
    row shares gathered from every rank, or ``tensor`` itself when it holds them all; a
    ValueError naming ``name`` for any other split."""
    if isinstance(tensor, DTensor):
        tensor = tensor.full_tensor()
    else:
        tensor = tensor.detach()
        world = dist.get_world_size()
        if tensor.shape[0] * world == config.vocab_size and world > 1:
            shares = [torch.empty_like(tensor) for _ in range(world)]
            dist.all_gather(shares, tensor.contiguous())
            tensor = torch.cat(shares)
    if tensor.shape[0] < config.vocab_size or (
            tensor.dim() == 2 and tensor.shape[1] != config.hidden_size):
        raise ValueError(f"the target's {name} is split in a way a draft head cannot gather "
                         f"(shape {tuple(tensor.shape)} on this rank; vocab_size "
                         f"{config.vocab_size}, hidden_size {config.hidden_size})")
    return tensor.detach()


def lead_or_follow(runner: ModelRunner) -> LeaderRunner:
    """Rank 0: ``runner`` as a :class:`LeaderRunner`. Any other rank: replay rank 0's calls on
    ``runner`` until rank 0 stops, then end the process (exit status 0): what rank 0's script
    does after building its engine is rank 0's alone."""
    # (one forward per step message, laid out as sent: the ranks run the same ones)
    runner.split_mixed = runner.fold_mixed = runner.pack_verifications = False
    if dist.get_rank() == 0:
        return LeaderRunner(runner)
    try:
        follow(runner)
    finally:  # (a follower that fails frees its graphs too: a live one hangs the teardown)
        take_down(runner)
    raise SystemExit(0)


def take_down(runner: ModelRunner | None = None) -> None:
    """Free ``runner``'s CUDA graphs (they hold the collectives' communicators: see
    :meth:`CudaGraphs.release`), destroy the process groups and drop this module's reference to
    the control group, so that gloo's threads end now and not in the interpreter's teardown (a
    group object still referenced there was destroyed with its threads joinable: "terminate
    called without an active exception", rank 0 aborting after its work was done; seen in three
    fresh clones' test runs, the third after the stop message and barrier below were added)."""
    graphs = getattr(runner, "graphs", None)
    if graphs is not None:
        graphs.release()
    if dist.is_initialized():
        dist.destroy_process_group()
    _GROUP.clear()
    gc.collect()


class LeaderRunner:
    """Rank 0's runner under tensor parallelism: a :class:`ModelRunner` whose state-changing calls
    are replayed by every follower rank (see the module docstring). Everything else (budget,
    ``vocab_size``, ``graphs`` ...) is the wrapped runner's."""

    # (overlapped steps feed tokens left on the device, which no follower could replay: the
    # engine asks, and must not read the wrapped runner's answer through __getattr__)
    takes_fed_tokens = False

    def __init__(self, runner: ModelRunner):
        self._runner = runner
        self._pending: Calls = []
        self._stopped = False
        self._args: tuple | None = None  # the forward under way (sent at its launch)
        runner.before_launch = self._launch
        atexit.register(self._exit)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._runner, name)

    def allocate_slot(self) -> int:
        return self._record("allocate_slot", ())

    def free_slot(self, slot: int, cache_tokens: Sequence[int] | None = None) -> None:
        self._record("free_slot", (slot, None if cache_tokens is None else list(cache_tokens)))

    def attach_prefix(self, slot: int, token_ids: Sequence[int]) -> None:
        self._record("attach_prefix", (slot, list(token_ids)))

    def truncate(self, slot: int, length: int) -> None:
        self._record("truncate", (slot, length))

    def keep_path(self, slot: int, first: int, path: Sequence[int]) -> None:
        self.keep_paths([(slot, first, path)])

    def keep_paths(self, paths: Sequence[tuple[int, int, Sequence[int]]]) -> None:
        self._record("keep_paths", ([(s, f, list(p)) for s, f, p in paths],))

    def forward(self, slots: Sequence[int], token_ids: Sequence[Sequence[int]],
                logits_indices: Sequence[int] | torch.Tensor | None = None,
                trees: Sequence[Tree | None] | None = None,
                keep_hidden: bool = False) -> ForwardOutput:
        """Run this forward here; once it is checked and its graph decision made, the recorded
        calls, its arguments and that decision go to the followers (:meth:`_launch`; the
        hidden states are this rank's alone: the followers do not keep them)."""
        if isinstance(logits_indices, torch.Tensor):
            logits_indices = logits_indices.tolist()
        self._args = (list(slots), [list(t) for t in token_ids],
                      None if logits_indices is None else list(logits_indices),
                      None if trees is None else [None if t is None else (t[0], list(t[1]))
                                                  for t in trees])
        try:
            return self._runner.forward(*self._args, keep_hidden=keep_hidden)
        finally:
            self._args = None

    def _launch(self, decision: Decision) -> None:
        """The wrapped runner's :attr:`~ModelRunner.before_launch`: send the step."""
        if self._args is None:
            raise RuntimeError("under tensor parallelism rank 0's forwards go through its "
                               "LeaderRunner (the other ranks replay them)")
        self._send([*self._pending, ("forward", self._args, decision)])
        self._pending = []

    def shutdown(self) -> None:
        """Tell the followers to return (once; at interpreter exit at the latest), and wait
        until every rank has the message (a rank that tears its group down while another is
        still receiving can abort)."""
        if self._stopped:
            return
        self._stopped = True
        if dist.is_initialized():
            self._send(STOP)
            dist.barrier(group=control_group())

    def _exit(self) -> None:
        """At interpreter exit: stop the followers (if :meth:`shutdown` has not) and take the
        process groups down, as they do (:func:`take_down`)."""
        self.shutdown()
        take_down(self._runner)

    def _record(self, name: str, args: tuple) -> Any:
        result = getattr(self._runner, name)(*args)  # raises before recording a refused call
        self._pending.append((name, args))
        return result

    def _send(self, message: Calls | str) -> None:
        if self._stopped and message != STOP:
            raise RuntimeError("the tensor-parallel followers were stopped (shutdown was called)")
        broadcast(message)


@torch.inference_mode()
def follow(runner: ModelRunner) -> int:
    """A follower rank's loop: replay the leader's calls on ``runner`` until it stops. Returns
    the number of forwards run. Under inference mode, as rank 0's engine steps are: the
    runner's buffers are inference tensors, and a call that writes one outside that mode raises
    (a tree's ``keep_paths`` on rank 1, first seen on two GPUs)."""
    forwards = 0
    while True:
        message = broadcast()
        if message == STOP:
            dist.barrier(group=control_group())  # (the leader's, in LeaderRunner.shutdown)
            return forwards
        for name, args, *decision in message:
            if name not in (*_MUTATING, "forward"):
                raise RuntimeError(f"unknown tensor-parallel call {name!r} from rank 0")
            if name != "forward":
                getattr(runner, name)(*args)  # it succeeded on the leader
                continue
            forwards += 1
            if runner.graphs is not None:  # (the leader's bucket and captures)
                runner.graphs.dictate(decision[0])
            elif decision and decision[0][0] is not None:  # (a graph here only: it would hang)
                raise RuntimeError("rank 0 replays CUDA graphs and this rank has none: every "
                                   "rank must run the same configuration")
            runner.forward(*args)  # (checked on the leader: it ran there)
