"""specdec engine: the public API is ``LLM`` and ``SamplingParams``."""

from engine.sampling_params import SamplingParams

__all__ = ["SamplingParams"]
