"""Timed greedy runs for ``benchmarks/e2e.py``: the engine, and Hugging Face ``generate``.

Every run decodes exactly ``max_tokens`` tokens per prompt, going on past EOS (engine
``ignore_eos``, HF with no EOS in its generation config), so all systems do the same work and
their greedy outputs can be compared token for token. Batch size b: the prompts go in groups
of b, and the systems take turns group by group, so a change in the machine's load hits them
alike.
"""

from __future__ import annotations

import copy
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from samplers.sampling_params import SamplingParams


@dataclass
class RunResult:
    """One timed run: a system on one prompt kind at one batch size."""

    system: str            # "engine" or "hf"
    method: str            # "none", "ngram", "early_exit", "draft_model", "prompt_lookup"
    kind: str              # "copy" or "open"
    batch_size: int
    k: int
    num_tokens: int = 0
    seconds: float = 0.0
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    # accepted / drafted at draft position 1, 2, ... (the engine's metrics; [] without drafts)
    acceptance_per_position: list[float] = field(default_factory=list)
    mean_k: float | None = None   # drafts verified per speculating request-step
    graph_captures: int = 0       # CUDA graphs captured inside the timed runs
    capture_seconds: float = 0.0  # host time those captures took (part of ``seconds``)
    outputs: list[list[int]] = field(default_factory=list, repr=False)
    # (stolen, all) CPU ticks of the machine during the timed runs; None off Linux
    cpu_ticks: tuple[int, int] | None = field(default=None, repr=False)
    # the speculation controller's state after the runs (controller_state), None without it
    controller: dict | None = None

    @property
    def name(self) -> str:
        return f"{self.system}:{self.method}"

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0

    @property
    def steal(self) -> float | None:
        """The share of the machine's CPU time that the hypervisor took (steal) during the timed
        runs, None off Linux: on a shared VM it slows everything by that much, unevenly in time."""
        if self.cpu_ticks is None:
            return None
        return self.cpu_ticks[0] / max(self.cpu_ticks[1], 1)

    def add(self, outputs: list[list[int]], seconds: float,
            cpu_ticks: tuple[int, int] | None = None) -> None:
        """One timed group; ``cpu_ticks``: (stolen, all) CPU ticks of the machine meanwhile."""
        self.outputs += outputs
        self.num_tokens += sum(len(o) for o in outputs)
        self.seconds += seconds
        if cpu_ticks is not None:
            stolen, total = self.cpu_ticks or (0, 0)
            self.cpu_ticks = (stolen + cpu_ticks[0], total + cpu_ticks[1])

    def record(self) -> dict:
        """The JSON record of this run (no outputs, no tick counts: the steal share)."""
        fields = {k: v for k, v in asdict(self).items() if k not in ("outputs", "cpu_ticks")}
        return {**fields, "steal": self.steal}


def controller_state(llm: Any, batch: int) -> dict | None:
    """What an engine's speculation controller decides from, None when it has none (fixed k, no
    speculation): its step costs at ``batch`` by width (``costs[w - 1]``: a step of ``w`` tokens
    per sequence over a plain one), the engine-wide acceptance rates (by backed draft
    position, then the unbacked drafts pooled and the proposals that found drafts), and the
    recent step times that the costs are read from (``samples_ms[w]``, oldest first)."""
    policy = llm.engine.spec_policy
    if not policy.adaptive:
        return None
    controller = policy.controller
    table = controller.costs
    return dict(costs=[round(float(c), 4) for c in controller.step_cost(batch)[1:]],
                acceptance=[round(float(r), 4) for r in controller.acceptance.engine_rates],
                samples_ms={w: [round(1e3 * s, 3) for s in table.samples("step", batch, w)]
                            for w in range(1, controller.max_k + 2)})


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def cpu_ticks() -> tuple[int, int] | None:
    """(steal, total) CPU ticks of the machine since boot (``/proc/stat``), None off Linux."""
    try:
        with open("/proc/stat") as stat:
            ticks = [int(x) for x in stat.readline().split()[1:]]
    except (OSError, ValueError):
        return None
    return (ticks[7], sum(ticks)) if len(ticks) > 7 else None


def timed(generate: Callable[[list[list[int]]], list[list[int]]], group: list[list[int]],
          device: torch.device) -> tuple[list[list[int]], float, tuple[int, int] | None]:
    """(outputs, seconds, (steal, total) CPU ticks meanwhile) of ``generate(group)``,
    synchronized on CUDA."""
    _sync(device)
    before = cpu_ticks()
    start = time.perf_counter()
    outputs = generate(group)
    _sync(device)
    seconds = time.perf_counter() - start
    after = cpu_ticks()
    ticks = None if before is None or after is None else (after[0] - before[0],
                                                          after[1] - before[1])
    return outputs, seconds, ticks


def graph_stats(llm: Any) -> tuple[int, float]:
    """(graphs captured, seconds spent capturing) so far by the engine's runners (the target's
    and a draft's), (0, 0.0) without CUDA graphs."""
    runners = [llm.engine.runner, getattr(llm.engine.proposer, "runner", None)]
    graphs = [r.graphs for r in runners if r is not None and r.graphs is not None]
    return sum(g.num_graphs for g in graphs), sum(g.capture_seconds for g in graphs)


def engine_generate(llm: Any, group: list[list[int]], max_tokens: int,
                    temperature: float = 0.0) -> list[list[int]]:
    """Engine generation of exactly ``max_tokens`` tokens per prompt, one batch (greedy, or
    sampled at ``temperature`` without a seed)."""
    params = SamplingParams(temperature=temperature, max_tokens=max_tokens, ignore_eos=True)
    return [o.outputs[0].token_ids for o in llm.generate(group, params, use_tqdm=False)]


@torch.inference_mode()
def hf_generate(model: Any, group: list[list[int]], pad_id: int, max_tokens: int,
                device: torch.device, prompt_lookup: int | None = None) -> list[list[int]]:
    """HF ``generate`` (greedy, no EOS), plain or with ``prompt_lookup_num_tokens`` (batch 1)."""
    if prompt_lookup is not None and len(group) != 1:
        raise ValueError("HF prompt lookup decoding only runs at batch size 1")
    width = max(len(p) for p in group)
    # Left padding: every row's last prompt token sits at the same column.
    input_ids = torch.full((len(group), width), pad_id, dtype=torch.long)  # [batch, width]
    attention_mask = torch.zeros((len(group), width), dtype=torch.long)  # [batch, width]
    for row, prompt in enumerate(group):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    config = copy.deepcopy(model.generation_config)
    # eos_token_id=None would fall back to the model's EOS (transformers 5); [] means none.
    config.update(eos_token_id=[], pad_token_id=pad_id, do_sample=False, temperature=None,
                  top_p=None, top_k=None, max_new_tokens=max_tokens,
                  prompt_lookup_num_tokens=prompt_lookup)
    out = model.generate(input_ids.to(device), attention_mask=attention_mask.to(device),
                         generation_config=config)
    return [row[width:].tolist() for row in out]  # [batch, max_tokens] each
