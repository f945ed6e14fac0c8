"""Timed greedy runs for ``benchmarks/e2e.py``: the engine, and Hugging Face ``generate``.

Every run decodes exactly ``max_tokens`` tokens per prompt, going on past EOS (engine
``ignore_eos``, HF with no EOS in its generation config), so all systems do the same work and
their greedy outputs can be compared token for token. Batch size b: the prompts go in groups
of b.
"""

from __future__ import annotations

import copy
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from engine.sampling_params import SamplingParams


@dataclass
class RunResult:
    """One timed run: a system on one prompt kind at one batch size."""

    system: str            # "engine" or "hf"
    method: str            # "none", "ngram", "early_exit", "draft_model", "prompt_lookup"
    kind: str              # "copy" or "open"
    batch_size: int
    k: int
    num_tokens: int
    seconds: float
    acceptance_rate: float | None = None
    mean_accepted_length: float | None = None
    outputs: list[list[int]] = field(default_factory=list, repr=False)

    @property
    def name(self) -> str:
        return f"{self.system}:{self.method}"

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.seconds if self.seconds > 0 else 0.0


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _groups(prompts: list[list[int]], batch_size: int) -> list[list[list[int]]]:
    return [prompts[i:i + batch_size] for i in range(0, len(prompts), batch_size)]


def run_engine(llm: Any, method: str, k: int, kind: str, prompts: list[list[int]],
               batch_size: int, max_tokens: int, device: torch.device) -> RunResult:
    """Greedy engine generation of ``max_tokens`` tokens per prompt, groups of ``batch_size``."""
    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    llm.reset_metrics()
    outputs = []
    _sync(device)
    start = time.perf_counter()
    for group in _groups(prompts, batch_size):
        outputs += [o.outputs[0].token_ids for o in llm.generate(group, params, use_tqdm=False)]
    _sync(device)
    seconds = time.perf_counter() - start
    metrics = llm.get_metrics()
    speculating = method != "none"
    return RunResult("engine", method, kind, batch_size, k if speculating else 0,
                     sum(len(o) for o in outputs), seconds,
                     metrics.acceptance_rate if speculating else None,
                     metrics.mean_accepted_length if speculating else None, outputs)


def _hf_group(model: Any, group: list[list[int]], pad_id: int, max_tokens: int,
              prompt_lookup: int | None, device: torch.device) -> list[list[int]]:
    width = max(len(p) for p in group)
    # Left padding: every row's last prompt token sits at the same column.
    input_ids = torch.full((len(group), width), pad_id, dtype=torch.long)  # [batch, width]
    attention_mask = torch.zeros((len(group), width), dtype=torch.long)  # [batch, width]
    for row, prompt in enumerate(group):
        input_ids[row, width - len(prompt):] = torch.tensor(prompt)
        attention_mask[row, width - len(prompt):] = 1
    config = copy.deepcopy(model.generation_config)
    config.update(eos_token_id=None, pad_token_id=pad_id, do_sample=False, temperature=None,
                  top_p=None, top_k=None, max_new_tokens=max_tokens,
                  prompt_lookup_num_tokens=prompt_lookup)
    out = model.generate(input_ids.to(device), attention_mask=attention_mask.to(device),
                         generation_config=config)
    return [row[width:].tolist() for row in out]  # [batch, max_tokens] each


@torch.inference_mode()
def run_hf(model: Any, pad_id: int, kind: str, prompts: list[list[int]], batch_size: int,
           max_tokens: int, device: torch.device, prompt_lookup: int | None = None) -> RunResult:
    """HF ``generate`` (greedy), plain or with ``prompt_lookup_num_tokens`` (batch 1 only)."""
    if prompt_lookup is not None and batch_size != 1:
        raise ValueError("HF prompt lookup decoding only runs at batch size 1")
    outputs = []
    _sync(device)
    start = time.perf_counter()
    for group in _groups(prompts, batch_size):
        outputs += _hf_group(model, group, pad_id, max_tokens, prompt_lookup, device)
    _sync(device)
    seconds = time.perf_counter() - start
    method = "none" if prompt_lookup is None else "prompt_lookup"
    return RunResult("hf", method, kind, batch_size, prompt_lookup or 0,
                     sum(len(o) for o in outputs), seconds, outputs=outputs)
