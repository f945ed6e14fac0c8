"""What one proposal of the draft head costs: host time, GPU time, and its kernels (CUDA only).

The shipped head (``proposers/heads/smollm2-135m``) over the default model's shape with random
weights (what a proposal costs does not depend on what it accepts), ``batch`` requests of
``--context`` tokens, each step one new verified position per request (``on_features``) and a
proposal of ``-k`` chained drafts (or a tree with ``--draft-tree``), replayed from its CUDA
graph; then ``--gaps``: that many plain steps (each shown to ``observe`` while the GPU runs a
stand-in forward of about 2 ms, as the engine does while a target forward runs: its host time
must stay below that) before a timed proposal. Per proposal: the wall time of ``propose`` (its
host work, the graph's replay and the wait for the drafts), the GPU time of the replay alone
(CUDA events around it), and under the torch profiler each kernel's launches and GPU time.
For reading where a proposal goes, not for end-to-end speed (the e2e suite)::

    python -m benchmarks proposers head-cost --batch-sizes 1,8,32
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from benchmarks.models import build_model
from benchmarks.record import Result
from proposers import FeatureUpdate, ProposeRequest
from proposers.draft_head import DEFAULT_HEAD_DIR, DraftHead, DraftHeadProposer
from samplers.sampling_params import SamplingParams


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="random-smollm2-135m")
    p.add_argument("--batch-sizes", default="1,8,32")
    p.add_argument("-k", type=int, default=4)
    p.add_argument("--context", type=int, default=100)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--profile-steps", type=int, default=10)
    p.add_argument("--draft-tree", default=None, help="e.g. 4,2,2")
    p.add_argument("--gaps", default="8,32", help="plain steps before a timed proposal")


# GPU clock cycles of the stand-in forward queued before each observe() (a couple of
# milliseconds): observe() must return without waiting for it
FORWARD_CYCLES = 4_000_000


class _TimedGraphs:
    """CUDA events around each replay of the proposer's graphs (``KeyedGraphs.run``)."""

    def __init__(self, graphs) -> None:
        self.graphs, self._run = graphs, graphs.run
        self.pairs: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []
        self.host_before: list[float] = []  # seconds from propose's start to the replay call
        self.start = 0.0
        graphs.run = self.run

    def run(self, key, body, inputs):
        self.host_before.append(time.perf_counter() - self.start)
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        begin.record()
        out = self._run(key, body, inputs)
        end.record()
        self.pairs.append((begin, end))
        return out


def run_batch(model, head: DraftHead, batch: int, k: int, context: int, steps: int,
              tree: list[int] | None, profile_steps: int, gaps: list[int]) -> dict:
    device = model.device
    vocab = model.get_output_embeddings().weight.shape[0]
    # every token the run appends, so that the head's cache never grows (and drops its graphs)
    longest = context + 2 * (steps + profile_steps) + sum(3 * (g + 2) for g in gaps) + 16
    proposer = DraftHeadProposer(head, model.get_input_embeddings(),
                                 model.get_output_embeddings(), vocab, max_num_seqs=batch,
                                 max_model_len=longest, max_pending=k + 1, graphs=True, tree=tree)
    proposer.cache.ensure(longest + 2 * k + 8)
    hidden = model.config.hidden_size
    gen = torch.Generator().manual_seed(0)
    contexts = {f"r{i}": torch.randint(2, vocab, (context,), generator=gen).tolist()
                for i in range(batch)}
    dtype = next(head.parameters()).dtype
    features = torch.randn(batch * context, hidden, device=device, dtype=dtype)
    proposer.on_features([FeatureUpdate(r, 0, len(t) - 1, t, i * context)
                          for i, (r, t) in enumerate(contexts.items())], features)
    greedy = SamplingParams(temperature=0)
    timer = _TimedGraphs(proposer.graphs)
    walls: list[float] = []
    feeds: list[float] = []  # on_features' host seconds after a proposal's step
    plain_feeds: list[float] = []  # ... after a plain step's
    observes: list[float] = []  # observe()'s host seconds in a plain step

    def step(propose: bool = True) -> None:
        if propose:
            requests = [ProposeRequest(r, t, k, greedy, tree=tree is not None)
                        for r, t in contexts.items()]
            timer.start = time.perf_counter()
            drafts = proposer.propose(requests).draft_token_ids
            walls.append(time.perf_counter() - timer.start)
        else:  # (a plain step: one token each, no proposal; shown to observe() as the engine
            # does while a GPU forward runs)
            torch.cuda._sleep(FORWARD_CYCLES)  # (a forward the GPU is busy with meanwhile)
            start = time.perf_counter()
            proposer.observe([ProposeRequest(r, t, 0, greedy) for r, t in contexts.items()])
            observes.append(time.perf_counter() - start)
            torch.cuda.synchronize()
            drafts = [[(t[-1] * 5 + 1) % vocab] for t in contexts.values()]
        for t, d in zip(contexts.values(), drafts, strict=True):  # (accept one, then a bonus)
            t.extend([d[0], (t[-1] * 7 + 3) % vocab] if propose else d)
        n = 2 if propose else 1
        row = torch.randn(n * batch, hidden, device=device, dtype=dtype)
        updates = [FeatureUpdate(r, len(t) - 1 - n, n, t) for r, t in contexts.items()]
        start = time.perf_counter()
        proposer.on_features(updates, row)
        (feeds if propose else plain_feeds).append(time.perf_counter() - start)

    for _ in range(steps):
        step()
    torch.cuda.synchronize()
    warm = 4  # (eager first meeting, capture, then replays)
    gpu_ms = [b.elapsed_time(e) for b, e in timer.pairs[warm:]]
    wall_ms = [1e3 * w for w in walls[warm:]]
    before_ms = [1e3 * s for s in timer.host_before[warm:]]
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(profile_steps):
            step()
        torch.cuda.synchronize()
    after_gap: dict[int, list[float]] = {}  # plain steps before it -> proposals' wall ms
    for gap in gaps:
        for _ in range(3):
            for _ in range(gap):
                step(propose=False)
            step()
            after_gap.setdefault(gap, []).append(1e3 * walls[-1])
    kernels = {}
    for event in prof.key_averages():
        if event.device_type == torch.autograd.DeviceType.CUDA and event.count:
            kernels[event.key] = {"per_proposal": event.count / profile_steps,
                                  "us_per_proposal": event.device_time_total / profile_steps}
    return {
        "batch": batch, "k": k, "tree": tree, "context": context,
        "wall_ms_median": statistics.median(wall_ms),
        "replay_gpu_ms_median": statistics.median(gpu_ms),
        "host_before_replay_ms_median": statistics.median(before_ms),
        "kernels_per_proposal": sum(v["per_proposal"] for v in kernels.values()),
        "kernel_us_per_proposal": sum(v["us_per_proposal"] for v in kernels.values()),
        "kernels": dict(sorted(kernels.items(), key=lambda kv: -kv[1]["us_per_proposal"])),
        "after_gap_ms": {g: statistics.median(v) for g, v in after_gap.items()},
        "on_features_ms_mean": 1e3 * statistics.fmean(feeds),
        "plain_on_features_ms_mean": 1e3 * statistics.fmean(plain_feeds) if plain_feeds else None,
        "observe_ms_mean": 1e3 * statistics.fmean(observes) if observes else None,
        "note": "the profile's kernels include the on_features writes between proposals",
    }


def run(args: argparse.Namespace) -> Result:
    if not torch.cuda.is_available():
        raise SystemExit("proposers head-cost times CUDA graphs: it needs a GPU")
    model, _ = build_model(args.model, "cuda", "bfloat16")
    head = DraftHead.load(DEFAULT_HEAD_DIR).to(device="cuda", dtype=torch.bfloat16).eval()
    tree = [int(b) for b in args.draft_tree.split(",")] if args.draft_tree else None
    rows = []
    for batch in (int(b) for b in args.batch_sizes.split(",")):
        r = run_batch(model, head, batch, args.k, args.context, args.steps, tree,
                      args.profile_steps, [int(g) for g in args.gaps.split(",") if g])
        rows.append(r)
        print(f"batch {batch:>3}: propose {r['wall_ms_median']:.3f} ms wall, replay "
              f"{r['replay_gpu_ms_median']:.3f} ms GPU, host before the replay "
              f"{r['host_before_replay_ms_median']:.3f} ms; "
              f"{r['kernels_per_proposal']:.0f} kernels, "
              f"{r['kernel_us_per_proposal']:.0f} us GPU a proposal (profiled); after plain "
              f"steps: {r['after_gap_ms']} ms; on_features {r['on_features_ms_mean']:.3f} ms "
              f"after a proposal, {r['plain_on_features_ms_mean'] or 0:.3f} ms after a plain step"
              f"; observe {r['observe_ms_mean'] or 0:.3f} ms (in the forward's shadow)")
        for name, v in list(r["kernels"].items())[:14]:
            print(f"      {v['per_proposal']:6.1f} x {v['us_per_proposal']:8.1f} us  {name[:90]}")
    return Result(rows, args.model)
