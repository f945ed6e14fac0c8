"""Engine and Hugging Face runs for the suites, and what an engine decided from.

Every run decodes exactly ``max_tokens`` tokens per prompt, going on past EOS (engine
``ignore_eos``, HF with no EOS in its generation config), so all systems do the same work and
their greedy outputs can be compared token for token.
"""

from __future__ import annotations

import copy
import gc
import time
from typing import Any

import torch
import triton

from samplers.sampling_params import SamplingParams
from scheduler import GoodputPolicy


def speculative_config(method: str, k: int, draft_tree: str | None = None,
                       adaptive: bool = True, **options: Any) -> dict | None:
    """The engine's ``speculative_config`` for ``method`` (None: ``none`` or ``eager``, no
    speculation); a ``_tree`` suffix drafts trees of ``draft_tree``'s shape ("3,2": candidates
    per node at each depth); ``adaptive`` False: every step verifies k drafts."""
    if method in ("none", "eager"):
        return None
    spec = {"method": method.removesuffix("_tree"), "num_speculative_tokens": k, **options}
    if method.endswith("_tree"):
        spec["draft_tree"] = [int(b) for b in (draft_tree or "3,2").split(",")]
    if not adaptive:
        spec["adaptive_k"] = False
    return spec


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


_CAPTURES = [0, 0.0, None]  # graphs captured in this process, their seconds, the open one's start
_COMPILES = [0, 0.0, None]  # Triton kernels compiled (or loaded from its disk cache), likewise
COMPILED: list[str] = []  # each such kernel's name, in order


def _count_captures() -> None:
    """Count every CUDA graph capture of the process from now on (``torch.cuda.CUDAGraph``'s
    ``capture_begin`` / ``capture_end`` wrapped once): the runner's, the draft head's, the
    device n-gram proposer's and the samplers' graphs alike."""
    cls = torch.cuda.CUDAGraph
    if getattr(cls, "_counted_by_benchmarks", False):
        return
    begin, end = cls.capture_begin, cls.capture_end

    def capture_begin(self, *args, **kwargs):
        _CAPTURES[2] = time.perf_counter()
        return begin(self, *args, **kwargs)

    def capture_end(self, *args, **kwargs):
        try:
            return end(self, *args, **kwargs)
        finally:
            _stop(_CAPTURES)

    cls.capture_begin, cls.capture_end = capture_begin, capture_end
    cls._counted_by_benchmarks = True


def _count_compiles() -> None:
    """Count every Triton kernel the process compiles (or loads from Triton's disk cache) from
    now on, through Triton's JIT hooks (chained to any set before), its name listed in
    :data:`COMPILED`; nothing where this Triton has no such hooks."""
    runtime = getattr(getattr(triton, "knobs", None), "runtime", None)
    if runtime is None or getattr(runtime, "_counted_by_benchmarks", False):
        return
    before, after = runtime.jit_cache_hook, runtime.jit_post_compile_hook

    def cache_hook(*args, **kwargs):
        COMPILED.append(str(kwargs.get("repr", "?")).partition("[")[0])
        _COMPILES[2] = time.perf_counter()
        return before(*args, **kwargs) if before is not None else None

    def post_compile_hook(*args, **kwargs):
        _stop(_COMPILES)
        return after(*args, **kwargs) if after is not None else None

    runtime.jit_cache_hook, runtime.jit_post_compile_hook = cache_hook, post_compile_hook
    runtime._counted_by_benchmarks = True


def _stop(counter: list) -> None:
    """One more of ``counter``'s events ended now: counted, with its seconds since its start."""
    counter[0] += 1
    if counter[2] is not None:
        counter[1] += time.perf_counter() - counter[2]
        counter[2] = None


def one_off_costs() -> tuple[int, float, int, float]:
    """(CUDA graphs captured, seconds capturing, Triton kernels compiled, seconds compiling) so
    far in this process, by every part of every engine, counted from the first call on (no
    graphs without CUDA)."""
    if torch.cuda.is_available():
        _count_captures()
    _count_compiles()
    return _CAPTURES[0], _CAPTURES[1], _COMPILES[0], _COMPILES[1]


def controller_state(llm: Any, batch: int) -> dict | None:
    """What an engine's speculation controller decides from, None when it has none (fixed k, no
    speculation): its step costs at ``batch`` by width (``costs[w - 1]``: a step of ``w`` tokens
    per sequence over a plain one), the engine-wide acceptance rates (by backed draft
    position, then the unbacked drafts pooled and the proposals that found drafts), and the
    recent step times that the costs are read from (``samples_ms[w]``, oldest first), and the
    payoff guard's state (``guard``: back-offs begun, and per batch bucket the realised payoff of
    its drafting steps, their evidence, whether a back-off runs, a drafting step's mean seconds
    and the plain seconds its tokens were judged worth, and the cost table's drift of a step's
    log seconds per context token there; None when it is off), and
    the tree gate's (``trees``: steps that chose trees and chains, and per batch size each arm's
    realised tokens per second; None without trees or the guard)."""
    policy = llm.engine.controller
    if not isinstance(policy, GoodputPolicy):
        return None
    controller = policy.controller
    table = controller.costs
    guard = policy.guard
    guard_state = None if guard is None else dict(
        backoffs=guard.backoffs,
        buckets={b: dict(payoff=round(st.payoff(), 4), weight=round(st.weight, 2),
                         backing_off=st.until >= 0,
                         step_ms=round(1e3 * st.seconds / st.weight, 3) if st.weight else None,
                         plain_equivalent_ms=(round(1e3 * st.plain_seconds / st.weight, 3)
                                              if st.weight else None),
                         drift_per_token=round(table.drift(b), 6))
                 for b, st in guard.buckets.items()})
    gate = policy.trees
    tree_state = None if gate is None else dict(
        tree_steps=gate.tree_steps, chain_steps=gate.chain_steps,
        buckets={b: dict(tree_tok_s=round(st.tree.rate, 1), chain_tok_s=round(st.chain.rate, 1))
                 for b, st in gate.buckets.items()})
    return dict(costs=[round(float(c), 4) for c in controller.step_cost(batch)[1:]],
                acceptance=[round(float(r), 4) for r in controller.acceptance.engine_rates],
                samples_ms={w: [round(1e3 * s, 3) for s in table.samples("step", batch, w)]
                            for w in range(1, controller.max_k + 2)},
                guard=guard_state, trees=tree_state)


def release(llm: Any) -> None:
    """Give an engine's KV cache and graphs back before the next one is built."""
    del llm.engine
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
