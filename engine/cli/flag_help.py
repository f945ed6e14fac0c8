"""What each generated flag does, for ``--help``: one phrase per dataclass field, keyed by
(section, field). The field's docstring in its dataclass is the full story."""

FLAG_HELP: dict[tuple[str, str], str] = {
    ("engine", "model"): "the target model: a hub id, a local directory, a .gguf file or "
                         "'smollm2-135m' (the embedded default)",
    ("engine", "tokenizer"): "a tokenizer name or path other than the model's own",
    ("engine", "dtype"): "the weights' dtype ('auto': the checkpoint's)",
    ("engine", "device"): "where the model runs: auto (the visible GPUs, else the CPU), cpu, "
                          "cuda or cuda:N",
    ("engine", "max_num_seqs"): "sequences decoded together in one step (each of n samples "
                                "counts)",
    ("engine", "max_num_batched_tokens"): "the most tokens one forward takes (prompt chunks "
                                          "plus k+1 per decoding sequence)",
    ("engine", "max_model_len"): "the longest prompt plus output, in tokens (none: the "
                                 "model's context length)",
    ("engine", "kv_cache_tokens"): "tokens the KV cache holds over all sequences (none: enough "
                                   "for max-num-seqs full sequences, capped)",
    ("engine", "seed"): "seeds the engine's random generator, used by requests without "
                        "--request-seed (none: torch's global one)",
    ("engine", "enforce_eager"): "run every forward eager, without CUDA graphs",
    ("engine", "fused_ops"): "on CUDA, run RMSNorm and rotary embedding as fused Triton kernels",
    ("engine", "attention_backend"): "how attention reads the KV cache: gather (copy out, "
                                     "then SDPA), paged (read in place by a Triton kernel) or "
                                     "auto (paged where it runs on CUDA, else gather)",
    ("engine", "gpu_memory_utilization"): "the share of GPU memory the engine may fill, the "
                                          "weights included",
    ("engine", "logprobs_mode"): "what logprobs hold: the model's raw or the processed "
                                 "(sampled) distribution, as logprobs or logits",
    ("engine", "trust_remote_code"): "allow a hub model's own modelling code",
    ("engine", "tensor_parallel_size"): "GPUs the model is split over (launch with torchrun "
                                        "--nproc-per-node N)",
    ("engine", "max_memory"): "with --device auto, caps the weights per device, e.g. "
                              "'{\"0\": \"10GiB\", \"cpu\": \"60GiB\"}'",
    ("engine", "structured_forced_tokens"): "under a grammar, verify at most this many tokens "
    "it forces as drafts per step (0: none)",
    ("engine", "num_threads"): "torch's CPU threads (none: OMP_NUM_THREADS if set, else the "
                               "physical cores available less one)",
    ("engine", "enable_prefix_caching"): "keep finished requests' KV rows by their tokens and "
                                         "reuse them for prompts that start the same way",
    ("engine", "deterministic"): "batch-invariant kernels: every token's logits bitwise the "
                                 "same whatever the step holds (greedy speculation equals plain "
                                 "decoding bit for bit); slower",
    ("engine", "async_scheduling"): "overlap the host's work with the device's: launch each "
                                    "plain decode step before the last one's tokens are read "
                                    "(default: on CUDA; drafting steps stay synchronous)",
    ("spec", "method"): "how drafts are proposed ('none': no speculation; not given with "
                        "--draft-model: inferred from it)",
    ("spec", "model"): "the draft model (hub id or path) for draft_model, a draft head's "
                       "directory for eagle / ngram_eagle, or a speculators EAGLE-3 head "
                       "(directory, or hub id in the local cache) for eagle3",
    ("spec", "tokenizer"): "the draft model's tokenizer, when not its own",
    ("spec", "num_speculative_tokens"): "the most draft tokens verified per step (k)",
    ("spec", "prompt_lookup_min"): "ngram: the shortest n-gram matched in the context",
    ("spec", "prompt_lookup_max"): "ngram: the longest n-gram matched in the context",
    ("spec", "num_early_exit_layers"): "early_exit: the target's first layers that draft",
    ("spec", "acceptance_method"): "how drafts are verified: rejection_sampler (lossless), "
                                   "greedy (argmax match) or typical acceptance (lossy)",
    ("spec", "posterior_threshold"): "typical acceptance: the probability threshold",
    ("spec", "posterior_alpha"): "typical acceptance: the entropy-scaled threshold's factor",
    ("spec", "draft_sample_method"): "how the draft picks its tokens when sampling",
    ("spec", "adaptive_k"): "choose each step's number of drafts (0 to k) for the most tokens "
                            "per second; off: always k",
    ("spec", "adaptive_guard"): "adaptive k: back off to plain steps at a batch size where "
                                "drafting's measured tokens/s fall below plain decoding's",
    ("spec", "verify_cost_per_token"): "adaptive k: fix the cost of verifying one more token, "
                                       "as a share of a decode step (none: measured)",
    ("spec", "draft_cost_ratio"): "adaptive k: fix the cost of a draft step / a target step "
                                  "(none: measured)",
    ("spec", "adaptive_probe_interval"): "adaptive k: the longest wait, in steps, between two "
                                         "probes while drafting does not pay",
    ("spec", "draft_tree"): "draft a tree: candidates per node at each depth (eagle, "
                            "ngram_eagle, eagle3)",
    ("spec", "draft_tree_sampling"): "draft trees for sampled requests too, not only greedy ones",
    ("spec", "suffix_decoding_max_tree_depth"): "suffix: the longest match plus draft, in tokens",
    ("spec", "suffix_decoding_max_cached_requests"): "suffix: finished requests whose text is "
                                                     "kept to draft from",
    ("spec", "suffix_decoding_max_spec_factor"): "suffix: the most drafts per matched token",
    ("spec", "suffix_decoding_min_token_prob"): "suffix: stop drafting when the path's "
                                                "estimated probability falls below this",
    ("sampling", "n"): "samples returned per prompt",
    ("sampling", "structured_outputs"): "hold the output to a constraint, as JSON: "
    '{"json": SCHEMA}, {"regex": ...}, {"choice": [...]}, {"grammar": EBNF} or '
    '{"json_object": true}',
    ("sampling", "presence_penalty"): "subtract this from the logits of tokens already generated",
    ("sampling", "frequency_penalty"): "subtract this times its count from each generated "
                                       "token's logit",
    ("sampling", "repetition_penalty"): "divide (or multiply, when negative) the logits of "
                                        "tokens seen in prompt or output by this",
    ("sampling", "temperature"): "sampling temperature (0: greedy)",
    ("sampling", "top_p"): "sample from the smallest set of tokens with this total probability",
    ("sampling", "top_k"): "sample from the k likeliest tokens (0 or -1: all)",
    ("sampling", "min_p"): "drop tokens less likely than this times the likeliest one",
    ("sampling", "seed"): "each request's own random seed (reproducible sampled output)",
    ("sampling", "stop"): "stop when the text contains this string",
    ("sampling", "stop_token_ids"): "stop at these token ids",
    ("sampling", "ignore_eos"): "keep generating past the end-of-sequence token",
    ("sampling", "max_tokens"): "the most tokens generated per sample (none: up to the "
                                "context length)",
    ("sampling", "min_tokens"): "generate at least this many tokens before any stop applies",
    ("sampling", "logprobs"): "return this many most likely tokens' logprobs per generated "
                              "token",
    ("sampling", "include_stop_str_in_output"): "keep the matched stop string in the text",
    ("sampling", "skip_special_tokens"): "leave special tokens out of the text",
    ("sampling", "logit_bias"): "add a bias to token ids' logits, as JSON "
                                "'{\"token id\": bias}'",
    ("sampling", "allowed_token_ids"): "sample only from these token ids",
    ("sampling", "bad_words"): "never generate this word",
    ("sampling", "prompt_logprobs"): "return this many logprobs per prompt token",
    ("sampling", "best_of"): "vLLM's best_of; only equal to n is supported",
    ("sampling", "detokenize"): "decode the output tokens to text",
    ("sampling", "truncate_prompt_tokens"): "keep only the prompt's last this many tokens",
    ("sampling", "spaces_between_special_tokens"): "put spaces between special tokens in the "
                                                   "text",
    ("sampling", "num_speculative_tokens"): "each request's own cap on drafts per step (0: no "
                                            "speculation for it; none: the engine's k)",
}
