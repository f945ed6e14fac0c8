"""The decoder layers' linear maps on CPU in float32, each step through the route that is fastest
on this machine for its number of rows.

A verification step at batch 1 runs every linear map of the model on k + 1 rows, a small batch on
one row per sequence. Which GEMM streams the weights best for a few rows depends on the CPU:

- ``linear``: ``nn.Linear`` as it is (MKL's ``x @ W^T``);
- ``reordered``: each weight reordered once into oneDNN's blocked layout
  (``torch.ops.mkldnn._reorder_linear_weight``, run by ``torch.ops.mkldnn._linear_pointwise``);
- ``transposed``: each weight transposed once into a contiguous ``W^T`` (``x @ W^T`` as MKL's
  plain row-major GEMM).

No route is best on every CPU: at 2 rows ``reordered`` is much the faster on one machine and
``linear`` on another (docs/design.md, "Measured reasons behind the runner's choices"). So a
runner measures the routes when it is first built over maps of these shapes (:func:`calibrate`:
a share of the maps, a few sample row counts, under a second for the default model, once per
process) and each forward of 1 to ``MAX_ROWS`` rows runs the route that was fastest for its row
count (the nearest sample at or above it), of ``linear`` and the one other route closest to the
fastest over all samples (one extra copy at most); other forwards (a prefill) run the model
unchanged.

The copies are taken for the weights as they were (weights changed afterwards are not seen) and
cost memory: a reordered copy +815 MB resident for the default model's 425 MB of decoder weights,
a transposed one its size again; only a route chosen for some row count is kept. The results
differ from ``nn.Linear``'s by float32 rounding only (the order of the sums), as those of one row
and of several already do. Runners over the same weights (the early-exit draft shares the
target's layers) share the copies. Elsewhere (GPU, other dtypes, a PyTorch without oneDNN: no
``reordered``) nothing is copied for the routes that cannot run.
"""

from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch
from torch import nn

MIN_ROWS = 1
MAX_ROWS = 64
ROUTES = ("linear", "reordered", "transposed")
SAMPLE_ROWS = (1, 2, 3, 5, 8, 16, 32, 64)  # the row counts calibrate() times
CALIBRATION_BYTES = 64 << 20  # weight bytes timed per pass (more than the caches hold)
CALIBRATION_PASSES = 2
KEEP_LINEAR = 1.03  # nn.Linear is kept unless another route is faster by more than this

# id(weight) -> (weight, its reordered copy), shared by every runner over that weight; an entry
# leaves with its weight (tensors compare elementwise, so they cannot be WeakKeyDictionary keys)
_PACKED: dict[int, tuple[weakref.ref, torch.Tensor]] = {}


_TRANSPOSED: dict[int, tuple[weakref.ref, torch.Tensor]] = {}  # id(weight) -> (weight, W^T)


def _shared(cache: dict, weight: torch.Tensor, make: Callable[[torch.Tensor], torch.Tensor]
            ) -> torch.Tensor:
    """``make(weight)``, one copy per weight in ``cache``, leaving with the weight."""
    key = id(weight)
    entry = cache.get(key)
    if entry is None or entry[0]() is not weight:
        entry = cache[key] = (weakref.ref(weight, lambda _: cache.pop(key, None)),
                              make(weight.detach()))
    return entry[1]


def transposed_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` as a contiguous ``[in, out]``, one copy per weight."""
    return _shared(_TRANSPOSED, weight, lambda w: w.t().contiguous())


def transposed_linear(x: torch.Tensor, transposed: torch.Tensor,
                      bias: torch.Tensor | None) -> torch.Tensor:
    """``x [rows, in] -> [rows, out]`` through a :func:`transposed_weight`."""
    if bias is None:
        return torch.mm(x, transposed)
    return torch.addmm(bias, x, transposed)


def reordered_weight(weight: torch.Tensor) -> torch.Tensor:
    """``weight [out, in]`` reordered for :func:`reordered_linear`, one copy per weight (shared
    by every runner over it: the early-exit draft's layers and head are the target's)."""
    return _shared(_PACKED, weight, torch.ops.mkldnn._reorder_linear_weight)  # blocked layout


def available() -> bool:
    """This PyTorch has oneDNN's reordered-weight linear."""
    return (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")
            and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _packable(module: nn.Module) -> bool:
    """A plain float32 ``nn.Linear`` on CPU whose ``forward`` nobody has replaced (accelerate's
    offloading hooks set an instance ``forward``: that one must stay)."""
    return (type(module) is nn.Linear and module.weight.device.type == "cpu"
            and module.weight.dtype == torch.float32 and "forward" not in module.__dict__
            and not hasattr(module, "_hf_hook"))


def reordered_linear(x: torch.Tensor, packed: torch.Tensor,
                     bias: torch.Tensor | None) -> torch.Tensor:
    """``x [rows, in] -> [rows, out]`` through a :func:`reordered_weight`."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [None], "")


def _route_forward(route: str, module: nn.Linear) -> Callable[[torch.Tensor], torch.Tensor]:
    """``module``'s forward through ``route`` (its weight's shared copy)."""
    bias = None if module.bias is None else module.bias.detach()
    if route == "reordered":
        weight, run = reordered_weight(module.weight), reordered_linear
    else:
        weight, run = transposed_weight(module.weight), transposed_linear

    def forward(x: torch.Tensor) -> torch.Tensor:  # x [..., in_features]
        rows = x.numel() // x.shape[-1]
        out = run(x.reshape(rows, x.shape[-1]), weight, bias)  # [rows, out]
        return out.view(*x.shape[:-1], out.shape[-1])

    return forward


# the maps' dtype and distinct weight shapes -> their routes: measured once per process,
# so that runners over the same layers (the early-exit draft's are the target's first ones) take
# the same routes, share one copy and round alike
_CALIBRATED: dict[tuple, dict[int, str]] = {}


def calibrate(modules: list[nn.Linear]) -> dict[int, str]:
    """The route for each of ``SAMPLE_ROWS``: :func:`choose_routes` of :func:`route_seconds`,
    once per process for maps of these shapes."""
    # (the maps' distinct shapes: a draft over the target's first layers has the same ones)
    key = (modules[0].weight.dtype, *sorted({tuple(m.weight.shape) for m in modules}))
    if key not in _CALIBRATED:
        _CALIBRATED[key] = choose_routes(route_seconds(modules))
    return dict(_CALIBRATED[key])


def _sample(modules: list[nn.Linear]) -> list[nn.Linear]:
    """The first maps of ``modules`` up to ``CALIBRATION_BYTES`` of weights."""
    sample, size = [], 0
    for module in modules:
        sample.append(module)
        size += module.weight.numel() * module.weight.element_size()
        if size >= CALIBRATION_BYTES:
            break
    return sample


def route_seconds(modules: list[nn.Linear]) -> dict[int, dict[str, float]]:
    """Seconds of a pass over the first maps of ``modules`` up to ``CALIBRATION_BYTES`` of
    weights, per sample row count and route (each weight read once per pass, so that the timing
    streams them from memory as a forward does; the routes taking turns; the best of
    ``CALIBRATION_PASSES``)."""
    sample = _sample(modules)
    with torch.no_grad():
        # (local copies: a route that loses keeps no memory)
        copies = {"linear": [(m.weight.detach(), nn.functional.linear) for m in sample],
                  "transposed": [(m.weight.detach().t().contiguous(), torch.mm)
                                 for m in sample]}
        if available():
            copies["reordered"] = [
                (torch.ops.mkldnn._reorder_linear_weight(m.weight.detach()),
                 lambda x, w: reordered_linear(x, w, None)) for m in sample]
        seconds: dict[int, dict[str, float]] = {}
        gen = torch.Generator().manual_seed(0)
        for rows in SAMPLE_ROWS:
            inputs = {m.in_features: torch.randn(rows, m.in_features, generator=gen)
                      for m in sample}
            best = seconds[rows] = dict.fromkeys(copies, float("inf"))
            for _ in range(CALIBRATION_PASSES):
                for route, maps in copies.items():
                    start = time.perf_counter()
                    for (weight, run), module in zip(maps, sample, strict=True):
                        run(inputs[module.in_features], weight)
                    best[route] = min(best[route], time.perf_counter() - start)
    return seconds


def choose_routes(seconds: dict[int, dict[str, float]]) -> dict[int, str]:
    """Per row count, ``linear`` or one other route, the same for all (one extra copy at most):
    the one whose times over all the row counts are closest to the fastest's (the sum of its
    ratios to the fastest), taken where ``linear`` is slower than it by more than
    ``KEEP_LINEAR``. ``seconds``: :func:`route_seconds`'s."""
    others = {r for times in seconds.values() for r in times} - {"linear"}
    other = min(sorted(others), key=lambda r: sum(times[r] / min(times.values())
                                                  for times in seconds.values()))
    return {rows: "linear" if times["linear"] <= times[other] * KEEP_LINEAR else other
            for rows, times in seconds.items()}


class PackedLinears:
    """Every plain float32 CPU ``nn.Linear`` under ``layers``, with the copies of its weight that
    the chosen routes read; empty for ``layers=None``. ``routes``: the route per sample row count
    (``SAMPLE_ROWS``; None: :func:`calibrate` measures them). :meth:`use` routes a forward's maps
    through them."""

    def __init__(self, layers: nn.Module | None,
                 routes: dict[int, str] | None = None) -> None:
        self._forwards: dict[str, list[tuple[nn.Linear, Callable]]] = {}
        self.routes: dict[int, str] = {}  # rows (1..MAX_ROWS) -> route
        modules = [] if layers is None else [m for m in layers.modules() if _packable(m)]
        if not modules:
            return
        if routes is None:
            routes = calibrate(modules)
        unknown = set(routes.values()) - set(ROUTES)
        if (unknown or not routes or not all(isinstance(r, int) and r > 0 for r in routes)
                or (not available() and "reordered" in routes.values())):
            raise ValueError(f"routes must map row counts > 0 to {ROUTES} (reordered where "
                             f"oneDNN is), got {routes!r}")
        samples = sorted(routes)
        for rows in range(MIN_ROWS, MAX_ROWS + 1):  # (the nearest sample at or above)
            self.routes[rows] = routes[next((s for s in samples if s >= rows), samples[-1])]
        with torch.no_grad():
            for route in set(self.routes.values()) - {"linear"}:
                self._forwards[route] = [(m, _route_forward(route, m)) for m in modules]

    def __len__(self) -> int:
        """The maps that some row count routes through a copy (0: every route ``linear``)."""
        return len(next(iter(self._forwards.values()), ()))

    @contextmanager
    def use(self, rows: int) -> Iterator[None]:
        """Within the block, a forward of ``rows`` rows runs the route chosen for ``rows`` when
        ``rows`` is in ``[MIN_ROWS, MAX_ROWS]`` (an instance ``forward`` on each module, removed
        after; ``linear``: the modules as they are)."""
        forwards = self._forwards.get(self.routes.get(rows, "linear"))
        if not forwards:
            yield
            return
        for module, forward in forwards:
            module.__dict__["forward"] = forward
        try:
            yield
        finally:
            for module, _ in forwards:
                module.__dict__.pop("forward", None)
