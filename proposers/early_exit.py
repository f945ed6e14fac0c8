"""Self-draft by early exit: the target's first N decoder layers, then its final norm and head.

The draft model is a *view* of the target: shallow copies of the top module and of its base
model whose decoder-layer list is the slice ``layers[:N]``, with a copied config saying
``num_hidden_layers = N`` (and ``layer_types`` sliced). Every parameter is the target's own
tensor: no second copy of the weights, only the draft's KV cache for N layers. It then drafts
like any draft model (:class:`~proposers.draft_model.DraftModelProposer`), with the same
vocabulary by construction. Shallow layers predict the next token far less well than the full
stack; the measured acceptance per N on the default model is in ``docs/performance.md``.
"""

from __future__ import annotations

import copy
from typing import Any

from torch import nn

from proposers.base import ProposerContext
from proposers.draft_model import DraftModelProposer
from proposers.registry import register_proposer

_LAYER_LISTS = ("layers", "h")  # LLaMA-like families, GPT-2


def early_exit_model(target: nn.Module, num_layers: int) -> nn.Module:
    """A causal LM made of ``target``'s first ``num_layers`` layers, sharing its weights."""
    base = target.base_model
    name = next((n for n in _LAYER_LISTS if isinstance(getattr(base, n, None), nn.ModuleList)),
                None)
    if name is None:
        raise ValueError(f"{type(target).__name__} has no decoder layer list "
                         f"({' or '.join(_LAYER_LISTS)}): early exit cannot slice it")
    layers = getattr(base, name)
    if isinstance(num_layers, bool) or not isinstance(num_layers, int) or not (
            1 <= num_layers <= len(layers)):
        raise ValueError(f"num_layers={num_layers!r} is invalid: allowed an integer in "
                         f"[1, {len(layers)}] (the target's decoder layers)")
    config = copy.deepcopy(target.config)
    config.num_hidden_layers = num_layers
    if getattr(config, "layer_types", None) is not None:
        config.layer_types = list(config.layer_types[:num_layers])
    draft_base = _shallow_copy(base)
    draft_base._modules[name] = nn.ModuleList(layers[:num_layers])
    draft_base.config = config
    if base is target:
        return draft_base
    draft = _shallow_copy(target)
    draft._modules[target.base_model_prefix] = draft_base
    draft.config = config
    return draft


def _shallow_copy(module: nn.Module) -> nn.Module:
    """A new module object whose children, parameters and buffers are ``module``'s own."""
    clone = copy.copy(module)
    clone._modules = dict(module._modules)
    clone._parameters = dict(module._parameters)
    clone._buffers = dict(module._buffers)
    return clone


def default_num_layers(num_target_layers: int) -> int:
    """The default depth of the self-draft: four fifths of the target's layers (at least 1).

    On the default model only deep drafts guess usefully, and none pays for itself on a model not
    trained for early exit (docs/design.md, "Measured reasons behind the runner's choices";
    docs/performance.md).
    """
    return max(1, round(num_target_layers * 0.8))


@register_proposer("early_exit", needs_kv_cache=True)
def build_early_exit(config: Any, ctx: ProposerContext) -> DraftModelProposer:
    """``SpeculativeConfig.num_early_exit_layers`` (None: :func:`default_num_layers`) and
    ``draft_sample_method``."""
    num_layers = config.num_early_exit_layers
    if num_layers is None:
        num_layers = default_num_layers(ctx.target_model.config.num_hidden_layers)
    draft = early_exit_model(ctx.target_model, num_layers)
    return DraftModelProposer(ctx.make_runner(draft), config.draft_sample_method == "greedy",
                              ctx.vocab_size, ctx.generator)
