"""The token-id sentinels and the draft limit, apart from the tensor code (no torch import), so
that configs and the CLI's ``--help`` can read them cheaply."""

# At most this many drafts per request and step (the verification kernels' compiled width).
MAX_SPEC_LEN = 32
# Dense outputs ``[batch_size, max_spec_len + 1]``: the slots after a request's last token.
PLACEHOLDER_TOKEN_ID = -1
# Every slot of the row of a request whose input was invalid (NaN logits, a draft id outside the
# vocabulary), written by the CUDA kernels instead of a host check that would synchronise.
INVALID_TOKEN_ID = -2
