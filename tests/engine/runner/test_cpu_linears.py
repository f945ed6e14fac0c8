"""The decoder's linear maps through the route measured fastest per row count
(engine/runner/cpu_linears.py: oneDNN-reordered or transposed weights, or ``nn.Linear``): the
same numbers as ``nn.Linear`` up to float32 rounding, each route used exactly for the row counts
it was chosen for within MIN_ROWS..MAX_ROWS, removed after every forward, copies shared between
runners over the same weights."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.profiler import ProfilerActivity, profile

from engine.runner import cpu_linears
from engine.runner.cpu_linears import (
    MAX_ROWS,
    MIN_ROWS,
    SAMPLE_ROWS,
    PackedLinears,
    available,
    choose_routes,
)
from engine.runner.model_runner import ModelRunner
from tests.conftest import tiny_model

needs_onednn = pytest.mark.skipif(
    not available(), reason="this PyTorch has no oneDNN linear (torch.ops.mkldnn)")
ROUTED = [pytest.param("reordered", marks=needs_onednn), "transposed"]


def linears(model: nn.Module) -> list[nn.Linear]:
    return [m for m in model.model.layers.modules() if isinstance(m, nn.Linear)]


OPS = {"reordered": "mkldnn::_linear_pointwise", "transposed": "aten::mm",
       "linear": "aten::linear"}  # (each route's operator)


def only(route: str) -> dict[int, str]:
    return dict.fromkeys(SAMPLE_ROWS, route)


def route_calls(fn, *args, route: str = "reordered") -> int:
    """How many times ``fn(*args)`` ran ``route``'s operator."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        fn(*args)
    return sum(e.count for e in prof.key_averages() if e.key == OPS[route])


def packed_calls(fn, *args) -> int:
    """How many times ``fn(*args)`` ran oneDNN's linear on a reordered weight."""
    return route_calls(fn, *args, route="reordered")


@pytest.mark.parametrize("route", ROUTED)
def test_routed_maps_match_nn_linear_for_every_row_count_in_range(route):
    model = tiny_model("llama", num_layers=2)
    packed = PackedLinears(model.model.layers, only(route))
    assert len(packed) == len(linears(model)) == 2 * 7  # q, k, v, o, gate, up, down
    gen = torch.Generator().manual_seed(0)
    for rows in (MIN_ROWS, 2, 5, 17, MAX_ROWS):
        for module in linears(model):
            x = torch.randn(1, rows, module.in_features, generator=gen)  # [1, rows, in]
            expected = nn.functional.linear(x, module.weight, module.bias)
            with packed.use(rows):
                assert "forward" in module.__dict__
                assert route_calls(module, x, route=route) == 1
                got = module(x)
            assert got.shape == expected.shape
            torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
            assert "forward" not in module.__dict__


@needs_onednn
def test_each_row_count_takes_the_route_of_the_nearest_sample_at_or_above_it():
    model = tiny_model("llama", num_layers=1)
    routes = {1: "transposed", 2: "linear", 3: "linear", 5: "reordered", 8: "reordered",
              16: "transposed", 32: "transposed", 64: "linear"}
    packed = PackedLinears(model.model.layers, routes)
    module = linears(model)[0]
    for rows, route in ((1, "transposed"), (2, "linear"), (4, "reordered"), (6, "reordered"),
                        (9, "transposed"), (33, "linear"), (MAX_ROWS + 1, "linear")):
        x = torch.randn(rows, module.in_features)  # [rows, in]
        with packed.use(rows):
            assert ("forward" in module.__dict__) == (route != "linear")
            assert route_calls(module, x, route=route) == 1
    with pytest.raises(ValueError, match="routes"):
        PackedLinears(model.model.layers, {1: "fast"})


@pytest.mark.parametrize("route", ROUTED)
def test_maps_with_a_bias_match_nn_linear(route):
    layers = nn.Sequential(nn.Linear(24, 40), nn.Linear(40, 24))  # (with biases)
    packed = PackedLinears(layers, only(route))
    for rows in (1, 3, 9):
        x = torch.randn(2, rows, 24)  # [2, rows, in]
        expected = layers(x)
        with packed.use(2 * rows):
            got = layers(x)
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)


def test_maps_of_the_same_shapes_are_calibrated_once(monkeypatch):
    """Runners over maps of the same shapes (the early-exit draft over the target's first layers)
    take the routes measured for the first: one copy, the same rounding."""
    timed = []
    monkeypatch.setattr(cpu_linears, "_CALIBRATED", {})
    monkeypatch.setattr(cpu_linears, "route_seconds", lambda modules: timed.append(
        len(modules)) or {1: {"linear": 2.0, "transposed": 1.0}})
    model = tiny_model("llama", num_layers=2)
    assert PackedLinears(model.model.layers).routes[1] == "transposed"
    assert PackedLinears(model.model.layers[:1]).routes[1] == "transposed"  # (its first maps)
    assert PackedLinears(tiny_model("llama", num_layers=2).model.layers).routes[1] == (
        "transposed")
    assert len(timed) == 1
    with pytest.raises(ValueError, match="routes"):
        PackedLinears(model.model.layers, {})


def test_the_fastest_route_is_chosen_with_one_extra_copy_at_most():
    """choose_routes on measured times: nn.Linear unless another route beats it by more than
    KEEP_LINEAR (3%), and only the one other route closest to the fastest over all rows."""
    seconds = {1: {"linear": 26.0, "reordered": 37.3, "transposed": 23.4},  # (session 18's
               2: {"linear": 26.1, "reordered": 43.7, "transposed": 44.3},  # Intel VM, ms)
               5: {"linear": 71.3, "reordered": 48.7, "transposed": 44.6},
               64: {"linear": 100.0, "reordered": 60.0, "transposed": 99.0}}
    assert choose_routes(seconds) == {1: "transposed", 2: "linear", 5: "transposed",
                                      64: "linear"}
    seconds[64]["transposed"] = 200.0  # (now reordered is closer to the fastest overall)
    assert choose_routes(seconds) == {1: "linear", 2: "linear", 5: "reordered",
                                      64: "reordered"}
    assert choose_routes({1: {"linear": 1.0, "transposed": 0.98}}) == {1: "linear"}


@needs_onednn
def test_rows_outside_the_range_run_the_model_unchanged():
    model = tiny_model("llama", num_layers=1)
    packed = PackedLinears(model.model.layers, only("reordered"))
    module = linears(model)[0]
    for rows in (MIN_ROWS - 1, MAX_ROWS + 1):
        with packed.use(rows):
            assert "forward" not in module.__dict__
            x = torch.randn(rows, module.in_features)  # [rows, in]
            assert packed_calls(module, x) == 0


@needs_onednn
def test_the_override_is_removed_when_the_forward_raises():
    model = tiny_model("llama", num_layers=1)
    packed = PackedLinears(model.model.layers, only("reordered"))
    with pytest.raises(RuntimeError, match="boom"), packed.use(MIN_ROWS):
        raise RuntimeError("boom")
    assert all("forward" not in m.__dict__ for m in linears(model))


@needs_onednn
def test_runner_steps_take_the_packed_route_by_rows_and_only_when_asked(monkeypatch):
    model = tiny_model("llama", num_layers=2)
    # (the routes a runner measures when it is built, fixed here: 1 row linear, more reordered)
    monkeypatch.setattr(cpu_linears, "calibrate", lambda modules: {1: "linear", 2: "reordered"})
    # (+ 1: the output head over several rows takes oneDNN's route too, cpu_lm_head.py)
    for pack, wanted in ((True, 2 * 7 + 1), (False, 1)):
        runner = ModelRunner(model, max_num_seqs=2, max_num_tokens=64, max_model_len=32,
                             pack_cpu_weights=pack)
        slots = [runner.allocate_slot(), runner.allocate_slot()]
        runner.forward(slots, [[1, 2, 3], [4, 5, 6]])
        # 1 sequence x 1 token: linear; 2 x 5 (verification): reordered
        assert packed_calls(runner.forward, slots[:1], [[7]]) == 0
        assert packed_calls(runner.forward, slots, [[9] * 5, [10] * 5]) == wanted
        assert all("forward" not in m.__dict__ for m in linears(model))


@needs_onednn
def test_runners_over_the_same_weights_share_one_packed_copy_that_leaves_with_them():
    model = tiny_model("llama", num_layers=2)
    weights = {id(m.weight) for m in linears(model)}
    PackedLinears(model.model.layers, only("reordered"))
    first = {key: entry[1] for key, entry in cpu_linears._PACKED.items() if key in weights}
    assert len(first) == len(weights)
    # e.g. the early-exit draft over the target's layers
    PackedLinears(model.model.layers, only("reordered"))
    assert all(cpu_linears._PACKED[key][1] is packed for key, packed in first.items())
    del model, first
    gc.collect()
    assert not weights & set(cpu_linears._PACKED)


@needs_onednn
def test_a_module_whose_forward_was_replaced_keeps_it():
    model = tiny_model("llama", num_layers=1)
    hooked = linears(model)[0]
    own = hooked.forward  # (as accelerate's hooks do: an instance forward)
    hooked.forward = lambda x: own(x) + 1.0
    packed = PackedLinears(model.model.layers, only("reordered"))
    assert len(packed) == len(linears(model)) - 1
    x = torch.randn(MIN_ROWS, hooked.in_features)  # [rows, in]
    with packed.use(MIN_ROWS):
        torch.testing.assert_close(hooked(x), own(x) + 1.0)
    torch.testing.assert_close(hooked(x), own(x) + 1.0)


@pytest.mark.parametrize("route", ROUTED)
def test_strided_inputs_give_the_same_numbers(route):
    model = tiny_model("llama", num_layers=1)
    packed = PackedLinears(model.model.layers, only(route))
    module = linears(model)[0]
    wide = torch.randn(2, 5, module.in_features + 7)[..., :module.in_features]  # rows strided
    by_column = torch.randn(module.in_features, 6).t()  # [6, in], column-major
    for x in (wide, by_column):
        assert not x.is_contiguous()
        with packed.use(x.numel() // x.shape[-1]):
            assert route_calls(module, x, route=route) == 1
            got = module(x)
        torch.testing.assert_close(got, nn.functional.linear(x, module.weight, module.bias),
                                   atol=1e-5, rtol=1e-5)
