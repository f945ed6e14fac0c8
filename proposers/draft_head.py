"""A trained draft head on the target's own hidden states (EAGLE-style feature drafting).

EAGLE (Li et al., arXiv 2401.15077) drafts from the target's *features*, the last hidden state
that its output head reads, instead of from tokens alone: the feature at position ``t`` and the
embedding of the token sampled there predict the feature at ``t + 1``, which the target's own
output head turns into the next draft; the prediction is fed back for the next draft. The
target's hidden state already holds most of what the next token needs, so a head this small
(one block, about a tenth of a decoder layer's attention-free cost) drafts far better than a
draft model of its size.

This head, version 1 (attention-free): ``f' = f + W2 act(W1 [norm(f); norm(e(x))])``, ``f`` the
target's final (normed) hidden state ``[hidden_size]``, ``e`` the target's input embedding.
Without attention it needs no KV cache of its own and no rollback: a sequence's state is the
one feature of its last verified position, which the target's verification forward computes
anyway (``Proposer.on_features``). Drafting ``k`` tokens for the whole batch is ``k`` batched
steps of the head plus the output head. Drafts are the head's argmax (one-hot drafts: rejection
sampling stays exact for sampled requests too).

The weights (``safetensors``) and a ``draft_head.json`` of its shape live in a directory; the
factory loads ``SpeculativeConfig.model`` when given, else the head shipped for the default
model (:data:`DEFAULT_HEAD_DIR`). Training: ``examples/train_draft_head.py`` (self-distillation
on the target's own outputs).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn

from proposers.base import Proposal, Proposer, ProposerContext, ProposeRequest
from proposers.head_graphs import HeadGraphs
from proposers.registry import register_proposer

DEFAULT_HEAD_DIR = Path(__file__).resolve().parent / "heads" / "smollm2-135m"
CONFIG_NAME, WEIGHTS_NAME = "draft_head.json", "draft_head.safetensors"


class DraftHead(nn.Module):
    """``forward(features [n, hidden], token_embeddings [n, hidden]) -> features [n, hidden]``:
    the predicted feature of the next position (see the module docstring)."""

    def __init__(self, hidden_size: int, intermediate_size: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.hidden_size, self.intermediate_size = hidden_size, intermediate_size
        self.feature_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.token_norm = nn.RMSNorm(hidden_size, eps=eps)
        self.up = nn.Linear(2 * hidden_size, intermediate_size, bias=False)
        self.down = nn.Linear(intermediate_size, hidden_size, bias=False)
        self.act = nn.SiLU()

    def forward(self, features: torch.Tensor, token_embeddings: torch.Tensor) -> torch.Tensor:
        both = torch.cat([self.feature_norm(features), self.token_norm(token_embeddings)], -1)
        return features + self.down(self.act(self.up(both)))  # [n, hidden_size]

    def shape(self) -> dict[str, int]:
        return {"hidden_size": self.hidden_size, "intermediate_size": self.intermediate_size}

    def save(self, directory: str | Path, card: dict[str, Any] | None = None) -> None:
        """The weights and shape, in ``directory`` (plus ``card``: how it was trained)."""
        from safetensors.torch import save_file

        out = Path(directory)
        out.mkdir(parents=True, exist_ok=True)
        save_file({k: v.detach().contiguous().cpu() for k, v in self.state_dict().items()},
                  str(out / WEIGHTS_NAME))
        (out / CONFIG_NAME).write_text(json.dumps({**self.shape(), **(card or {})}, indent=1))

    @classmethod
    def load(cls, directory: str | Path) -> DraftHead:
        from safetensors.torch import load_file

        path = Path(directory)
        config_file, weights_file = path / CONFIG_NAME, path / WEIGHTS_NAME
        for f in (config_file, weights_file):
            if not f.is_file():
                raise ValueError(f"draft head directory {str(path)!r} lacks {f.name}: a head is "
                                 f"saved by DraftHead.save (examples/train_draft_head.py)")
        shape = json.loads(config_file.read_text())
        head = cls(int(shape["hidden_size"]), int(shape["intermediate_size"]))
        head.load_state_dict(load_file(str(weights_file)))
        return head


class DraftHeadProposer(Proposer):
    """Chained greedy drafts from a :class:`DraftHead` over the target's features.
    ``embed``: the target's input embedding; ``lm_head``: its output head."""

    needs_features = True  # the engine hands it each verified position's feature

    def __init__(self, head: DraftHead, embed: nn.Module, lm_head: nn.Module,
                 vocab_size: int, graphs_max_batch: int = 0) -> None:
        self.head, self.embed, self.lm_head = head, embed, lm_head
        self.vocab_size = vocab_size
        self._features: dict[str | int, torch.Tensor] = {}  # req id -> [hidden_size]
        # on CUDA (graphs_max_batch > 0): the draft chain replays CUDA graphs by batch bucket
        weight = head.up.weight
        self.graphs = None if not graphs_max_batch or weight.device.type != "cuda" else \
            HeadGraphs(self.chain, head.hidden_size, weight.dtype, weight.device,
                       graphs_max_batch)

    def on_features(self, req_ids: Sequence[str | int], features: torch.Tensor) -> None:
        """Keep each request's feature at its last verified position (the one whose logits gave
        its newest token)."""
        for i, req_id in enumerate(req_ids):
            self._features[req_id] = features[i]

    def remove(self, req_id: str | int) -> None:
        self._features.pop(req_id, None)

    @torch.inference_mode()
    def propose(self, requests: Sequence[ProposeRequest]) -> Proposal:
        drafts: list[list[int]] = [[] for _ in requests]
        ready = [i for i, r in enumerate(requests)
                 if r.num_spec_tokens > 0 and r.req_id in self._features]
        if not ready:
            return Proposal(drafts, None)
        weight = self.head.up.weight
        features = torch.stack([self._features[requests[i].req_id] for i in ready]).to(
            device=weight.device, dtype=weight.dtype)  # [n, hidden_size]
        tokens = torch.tensor([requests[i].token_ids[-1] for i in ready],
                              device=weight.device)  # [n]
        steps = max(requests[i].num_spec_tokens for i in ready)
        out = (self.chain if self.graphs is None else self.graphs.run)(features, tokens, steps)
        rows = out.tolist()
        for row, i in zip(rows, ready, strict=True):
            drafts[i] = row[:requests[i].num_spec_tokens]
        return Proposal(drafts, None)

    def chain(self, features: torch.Tensor, tokens: torch.Tensor, steps: int) -> torch.Tensor:
        """``steps`` chained greedy drafts from ``features [n, hidden_size]`` (each sequence's
        last verified feature) and ``tokens [n]`` (its newest token): ``[n, steps]``."""
        dtype = self.head.up.weight.dtype
        out = torch.empty((features.shape[0], steps), dtype=torch.long, device=features.device)
        for j in range(steps):
            features = self.head(features, self.embed(tokens).to(dtype))
            logits = self.lm_head(features)[:, :self.vocab_size]  # [n, vocab_size]
            tokens = logits.argmax(dim=-1)  # [n]
            out[:, j] = tokens
        return out


@register_proposer("eagle")
def build_draft_head(config: Any, ctx: ProposerContext) -> DraftHeadProposer:
    """``SpeculativeConfig.model``: a head directory (None: the one shipped for the default
    model); its hidden size must be the target's."""
    directory = DEFAULT_HEAD_DIR if config.model is None else Path(str(config.model))
    head = DraftHead.load(directory)
    target = ctx.target_model
    hidden = target.config.hidden_size
    if head.hidden_size != hidden:
        raise ValueError(f"draft head {str(directory)!r} has hidden_size {head.hidden_size}; "
                         f"the target's is {hidden}: it was trained for another model")
    dtype = target.get_input_embeddings().weight.dtype
    head = head.to(device=ctx.device, dtype=dtype).eval()
    return DraftHeadProposer(head, target.get_input_embeddings(),
                             target.get_output_embeddings(), ctx.vocab_size,
                             ctx.max_num_seqs if ctx.cuda_graphs else 0)
