"""EAGLE-3 draft heads in the speculators format (method ``eagle3``).

``SpeculativeConfig(method="eagle3", model=DIR)``: ``DIR`` holds a head saved by the speculators
library, by ``examples/train_draft_head.py --arch eagle3`` or by ``examples/export_speculators.py``
(:mod:`proposers.speculators` checks it against the target). The head drafts as the ``eagle``
proposer does (:class:`proposers.draft_head.DraftHeadProposer`: its cache of verified pairs,
chains or trees, CUDA graphs), from the inputs of the target's auxiliary layers, which the
runner returns from the verification forward itself (``ModelRunner.keep_aux_layers``, inside
its CUDA graphs). Drafts are the head's argmax over its draft vocabulary, mapped to target ids
(``d2t``) before verification: one-hot drafts, so rejection sampling against the target's
processed distribution stays exact (q is 1 at the drafted target id and 0 elsewhere, outside
the draft vocabulary included).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from proposers.base import ProposerContext
from proposers.draft_head import DraftHeadProposer, beside
from proposers.registry import register_proposer
from proposers.speculators import load_eagle3


@register_proposer("eagle3")
def build_eagle3(config: Any, ctx: ProposerContext) -> DraftHeadProposer:
    """``SpeculativeConfig.model``: a speculators EAGLE-3 directory for this target."""
    if config.model is None:
        raise ValueError("SpeculativeConfig.model=None is invalid with method='eagle3': allowed "
                         "a speculators EAGLE-3 head's directory (config.json + safetensors)")
    embed, lm_head = ctx.embeddings()
    head = load_eagle3(Path(str(config.model)), ctx.target_model.config, ctx.vocab_size)
    head = head.to(device=ctx.device, dtype=embed.weight.dtype).eval()
    tokens = head.embed_tokens if head.embed_tokens is not None else embed
    return DraftHeadProposer(head, tokens, lm_head, ctx.vocab_size, ctx.max_num_seqs,
                             ctx.max_model_len, config.num_speculative_tokens + 1,
                             graphs=ctx.cuda_graphs and beside(head, tokens),
                             tree=config.draft_tree)
