"""Which models the model runner serves exactly, and the checks that refuse the others.

The runner (``engine.runner.model_runner``) hands every decoder layer a cache object of its own
and a 4-D mask ``[batch_size, 1, num_new, kv_len]`` built from per-sequence lengths. That is
exact only for families whose attention (a) goes through ``past_key_values.update(k, v,
layer_idx)``, (b) passes a prepared 4-D mask through ``transformers.masking_utils`` unchanged, (c)
takes explicit ``position_ids`` for its rotary or absolute position embeddings, and (d) computes
logits as ``lm_head(last_hidden_state)`` with nothing after it. The families below were checked
against that list in transformers 5.17 and 5.23 and are tested token for token in
``tests/engine/runner/test_model_runner.py``; anything else is refused rather than served wrongly.
"""

from __future__ import annotations

from transformers import PretrainedConfig

from engine.runner.attention_backend import GQA_SDPA

# model_type -> why it is servable (kept short; the tests are the proof).
SUPPORTED_MODEL_TYPES = {
    "llama": "rotary, full causal attention (SmolLM2, Llama 2/3, TinyLlama)",
    "mistral": "Llama with an optional sliding window (served while it covers max_model_len)",
    "qwen2": "rotary, q/k/v biases, full attention unless use_sliding_window",
    "qwen3": "rotary with q/k norms, full attention unless use_sliding_window",
    "gpt2": "absolute position embeddings (wpe), fused c_attn",
}

# Attention implementations that honour a custom 4-D mask (GQA_SDPA: ``sdpa`` once a runner has
# taken the model, see engine.runner.attention_backend).
MASKED_ATTENTION = ("sdpa", "eager", GQA_SDPA)


def check_model_supported(config: PretrainedConfig, max_model_len: int | None = None) -> None:
    """Raise ValueError, saying why, when the runner cannot serve ``config``'s model exactly.

    ``max_model_len`` (the longest sequence the runner will hold) is needed to accept a sliding
    window attention: the runner's mask is fully causal, which equals a window of ``w`` tokens only
    while no sequence is longer than ``w``. Without it, windowed models are refused.
    """
    model_type = getattr(config, "model_type", None)
    if getattr(config, "is_encoder_decoder", False):
        raise ValueError(f"model_type {model_type!r} is an encoder-decoder model; the runner "
                         "serves decoder-only causal LMs")
    if model_type not in SUPPORTED_MODEL_TYPES:
        raise ValueError(f"model_type {model_type!r} is not served by the model runner (its "
                         "attention was not checked to honour a custom 4-D mask and explicit "
                         "position ids); "
                         f"supported: {sorted(SUPPORTED_MODEL_TYPES)}")
    if not getattr(config, "is_causal", True) or getattr(config, "add_cross_attention", False):
        raise ValueError(f"model_type {model_type!r} is configured with non-causal or cross "
                         "attention")
    attn = getattr(config, "_attn_implementation", None) or "eager"
    if attn not in MASKED_ATTENTION:
        raise ValueError(f"attention implementation {attn!r} ignores custom masks; load the model "
                         f"with attn_implementation in {MASKED_ATTENTION}")
    window = sliding_window(config)
    if window is not None and (max_model_len is None or window < max_model_len):
        raise ValueError(f"model_type {model_type!r} uses sliding-window attention (window "
                         f"{window}); the runner serves it only with max_model_len <= {window}, "
                         f"got max_model_len={max_model_len}")


def sliding_window(config: PretrainedConfig) -> int | None:
    """The sliding window some layer of the model uses, or None when every layer is full."""
    window = getattr(config, "sliding_window", None)
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None:
        kinds = set(layer_types)
        if kinds == {"full_attention"}:
            return None
        if not kinds <= {"full_attention", "sliding_attention"} or window is None:
            raise ValueError(f"layer_types {sorted(kinds)} include a layer the runner cannot serve")
        return int(window)
    if getattr(config, "use_sliding_window", False) or window is not None:
        return int(window) if window is not None else None
    return None
