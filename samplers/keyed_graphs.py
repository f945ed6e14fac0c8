"""CUDA graphs of small device work, one per static layout (a key the caller chooses).

Some of a step's work is many small launches whose host time, on a GPU, is most of a small
target's step: the draft head's proposal (:mod:`proposers.draft_head`: writing the verified
pairs' keys and values, then per draft a query over the head's cache, the layer, the target's
output head and an argmax), a drafting flight's greedy verification (the three verification
kernels and their workspaces: ``engine.flight_steps``) and a sampling flight's filters, random
draws and verification (:mod:`samplers.sampled_chains`; the generators it draws from are
registered with each graph). Each is captured once per layout and
replayed as one launch. The caller pads its inputs to the layout (``key``) and hands them in a
fixed order; a layout runs eager the first time it is met (a shape's first run initialises
cuBLAS and the caching allocator, and compiles Triton kernels) and is captured the second time.
:meth:`clear` drops every graph (what they read moved: the head's cache).

The reference is the body itself: what runs on CPU and with ``enforce_eager``, and what the graph
captures unchanged. ``capture=False`` runs each layout eagerly through the same static buffers,
to check the padding off-GPU.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, field

import torch

from samplers.graph_capture import gc_paused

CAPTURE_AT = 2  # a layout is captured the second time it is met (the first runs eager)
Body = Callable[..., torch.Tensor]  # body(*inputs) -> out


@dataclass
class _Captured:
    graph: torch.cuda.CUDAGraph | None
    inputs: list[torch.Tensor]  # static inputs, in the body's argument order
    out: torch.Tensor  # static output
    # input index -> the fixed input (KeyedGraphs.run's ``fixed``) its buffer holds
    fixed: dict[int, torch.Tensor] = field(default_factory=dict)


def _padded(x: torch.Tensor, rows: int) -> torch.Tensor:
    """``x`` with zero rows appended up to ``rows`` (itself when it has them)."""
    if x.shape[0] == rows:
        return x
    return torch.cat([x, x.new_zeros((rows - x.shape[0], *x.shape[1:]))])


class KeyedGraphs:
    """Replays ``body(*inputs)`` from CUDA graphs by layout; see the module docstring."""

    def __init__(self, device: torch.device, capture: bool = True,
                 generators: Sequence[torch.Generator] = ()) -> None:
        self.device, self.capture = device, capture
        # (generators the bodies draw from, registered with each graph: a replay then moves
        # their offsets on as an eager draw does; torch's default generator registers itself)
        self.generators = list(generators)
        self._graphs: dict[Hashable, _Captured] = {}
        self._met: Counter[Hashable] = Counter()
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.num_replays = 0
        self.last_steady = True  # the last run replayed a graph captured before it

    @property
    def num_graphs(self) -> int:
        return len(self._graphs)

    def clear(self) -> None:
        self._graphs.clear()
        self._met.clear()
        # (a fresh memory pool: the old one is released with its last graph, and capturing
        # into a released pool's handle fails an allocator assertion in PyTorch)
        self._pool = torch.cuda.graph_pool_handle() if self.capture else None

    def __contains__(self, key: Hashable) -> bool:
        return key in self._graphs

    def ensure(self, key: Hashable, body: Body, inputs: Sequence[torch.Tensor]) -> None:
        """Capture ``key``'s graph now unless it has one (``inputs``: the layout's shapes; a
        capture first runs the body once, off the capture)."""
        if key not in self._graphs:
            self._graphs[key] = self._capture(body, inputs)

    def run(self, key: Hashable, body: Body, inputs: Sequence[torch.Tensor],
            rows: Sequence[int] | None = None, fixed: Sequence[int] = ()) -> torch.Tensor:
        """``body(*inputs)``, replayed from the graph of ``key`` once it has one. Every call
        with one ``key`` must pass inputs of the same shapes and dtypes, but for ``rows``:
        input ``i``'s static buffer has ``rows[i]`` rows (its first dimension), the input
        fills its first ones and the rest keep what they held (zeros at first: rows the
        body's output holds answers for that the caller drops). A key then serves every
        smaller input; its first run, eager, pads them too. ``fixed``: inputs whose tensors
        the caller never writes after handing them in; such an input is copied in only when
        it is another tensor than the one the graph's last replay took there."""
        captured = self._graphs.get(key)
        self.last_steady = captured is not None
        if captured is None:
            self._met[key] += 1
            padded = inputs if rows is None else [_padded(x, n) for x, n in zip(inputs, rows,
                                                                                strict=True)]
            if self._met[key] < CAPTURE_AT:
                return body(*padded)
            captured = self._graphs[key] = self._capture(body, padded)
        last = captured.fixed
        for i, (static, value) in enumerate(zip(captured.inputs, inputs, strict=True)):
            if i in fixed:
                if last.get(i) is value:
                    continue
                last[i] = value
            (static if static.shape[0] == value.shape[0] else static[:value.shape[0]]).copy_(value)
        if captured.graph is None:  # (capture=False: the static layout, eagerly)
            captured.out.copy_(body(*captured.inputs))
        else:
            captured.graph.replay()
        self.num_replays += 1
        return captured.out

    def _capture(self, body: Body, inputs: Sequence[torch.Tensor]) -> _Captured:
        static = [x.clone() for x in inputs]
        if not self.capture:
            return _Captured(None, static, body(*static))
        side = torch.cuda.Stream(self.device)  # (warm-up off the capture, as CUDA graphs want)
        side.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(side):
            body(*static)
        torch.cuda.current_stream(self.device).wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        for generator in self.generators:
            graph.register_generator_state(generator)
        with gc_paused(), torch.cuda.graph(graph, pool=self._pool):
            out = body(*static)
        return _Captured(graph, static, out)
