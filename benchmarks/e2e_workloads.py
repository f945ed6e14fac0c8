"""Models and prompts for ``benchmarks/e2e.py``.

Two prompt kinds: *copy-heavy* (the answer edits or quotes text given in the prompt, where n-gram
lookup pays) and *open-ended* (nothing to copy); ``copy_short`` is the first copy-heavy set, kept
to reproduce earlier measurements. For the embedded instruct model the prompts are
chat messages. Random-weight models (``random-llama-1b``, ``random-llama-8b``) get token-id
prompts and a synthetic word-level tokenizer: their output does not depend on the prompt's
meaning, so n-gram acceptance there comes only from the random model's own repetition loops.
"""

from __future__ import annotations

import random
from typing import Any

import torch

# Real shapes, random weights: Llama-3.2-1B (1.24 B parameters) and Llama-3.1-8B (8.0 B).
RANDOM_LLAMAS = {
    "random-llama-1b": dict(hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=64,
                            vocab_size=128256, tie_word_embeddings=True),
    "random-llama-8b": dict(hidden_size=4096, intermediate_size=14336, num_hidden_layers=32,
                            num_attention_heads=32, num_key_value_heads=8, head_dim=128,
                            vocab_size=128256, tie_word_embeddings=False),
    # The default model's shape (SmolLM2-135M) on random weights: what its steps and the
    # shipped draft head's proposals cost (not what they accept) in one device call, without
    # bringing the real weights (../shared/tools/gpu-default-model.md takes two)
    "random-smollm2-135m": dict(hidden_size=576, intermediate_size=1536, num_hidden_layers=30,
                                num_attention_heads=9, num_key_value_heads=3, head_dim=64,
                                vocab_size=49152, tie_word_embeddings=True),
    # (a forward of next to nothing: on CPU what a step costs beyond it is the host's work)
    "random-llama-tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                              num_attention_heads=4, num_key_value_heads=2, head_dim=16,
                              vocab_size=512, tie_word_embeddings=False),
}
RANDOM_EOS_ID = 1

# Copy-heavy prompts: eight edit or quote tasks whose source text is long enough (100-170
# prompt tokens) that the embedded model's 64-token answer is the edited or quoted text.
COPY_HEAVY = [
    "Copy the following paragraph, correcting the spelling mistakes. Keep everything else the "
    "same.\n\nSpeculative decoding lets a small draft model propose several tokens at once. The "
    "large model then checks all of them in a singel forward pass and keeps the longest prefix "
    "it agrees with, so the output is unchanged while fewer expensive steps are neded. Because "
    "the large model reads its weights from memory once per step, checking five tokens costs "
    "little more than generating one, and every acepted draft saves a whole step. The method "
    "works best when the text is predictable, for example when an answer repeats words from the "
    "question.",
    "Rename the variable `total` to `running_sum` in this Python function and return the whole "
    "function:\n\ndef summarize(values, threshold):\n    total = 0\n    count = 0\n"
    "    largest = None\n    for value in values:\n        if value < threshold:\n"
    "            continue\n        total = total + value\n        count = count + 1\n"
    "        if largest is None or value > largest:\n            largest = value\n"
    "    if count == 0:\n        return {\"mean\": 0.0, \"largest\": None, \"count\": 0}\n"
    "    return {\"mean\": total / count, \"largest\": largest, \"count\": count}\n",
    "Repeat the following passage exactly, inside quotation marks:\n\nThe river was low that "
    "summer, and the children walked along the dry stones where the water used to run. They "
    "found shells, a rusted key, and a small glass bottle with a folded note inside. Nobody "
    "could read the handwriting, so they carried the bottle to the old librarian, who held it "
    "up to the window for a long time before she smiled and said that the note was a recipe "
    "for plum cake, written by her grandmother seventy years ago.",
    "Turn this comma-separated list into a numbered list, one item per line: apples, bananas, "
    "cherries, dates, elderberries, figs, grapes, honeydew melons, kiwis, lemons, mangoes, "
    "nectarines, oranges, papayas, quinces, raspberries, strawberries, tangerines, watermelons, "
    "apricots, blueberries, coconuts, cranberries, guavas, limes.",
    "Here is a JSON object:\n{\"name\": \"Ada Lovelace\", \"born\": 1815, \"died\": 1852, "
    "\"field\": \"mathematics\", \"known_for\": \"the first published computer program\", "
    "\"country\": \"England\", \"city\": \"London\", \"father\": \"Lord Byron\", \"mother\": "
    "\"Anne Isabella Milbanke\", \"collaborator\": \"Charles Babbage\", \"machine\": "
    "\"Analytical Engine\", \"notes_published\": 1843}\nReturn the same JSON object with the "
    "field \"born\" changed to 1816.",
    "Fix the grammar in this email and return the corrected email:\n\nHello team, I wanted to "
    "let you know that the meeting are moved to thursday. Please bring you notes from last week "
    "and be ready to discuss the budget, which have changed a lot since we last talk. Maria "
    "and John is going to present the new sales numbers, and I will shares the plan for the "
    "next quarter. If you cannot attending, please send me a message before wednesday so we "
    "can finding another time. Thank you for you help, and see you all on thursday.",
    "Add a docstring to this function and return the complete function:\n\ndef "
    "schedule_tasks(tasks, workers, deadline):\n    assignments = {worker: [] for worker in "
    "workers}\n    loads = {worker: 0 for worker in workers}\n    for task in sorted(tasks, "
    "key=lambda t: t.duration, reverse=True):\n        worker = min(workers, key=lambda w: "
    "loads[w])\n        if loads[worker] + task.duration > deadline:\n            raise "
    "ValueError(f\"task {task.name} does not fit before the deadline\")\n        "
    "assignments[worker].append(task)\n        loads[worker] += task.duration\n    return "
    "assignments\n",
    "Convert these lines to Markdown bullet points, keeping the text of each line:\nBuy milk and "
    "eggs\nCall the plumber about the kitchen sink\nSend the quarterly report to Maria\nBook "
    "train tickets to Lyon\nWater the plants on the balcony\nPick up the dry cleaning on "
    "Friday\nRenew the library books before Monday\nAsk Tom about the weekend hiking trip\n"
    "Clean the bicycle chain and pump the tyres\nPay the electricity bill\nBuy a birthday "
    "present for Anna\nBack up the laptop to the external drive",
]

# The first copy-heavy set (kind "copy_short"), measured in sessions 1-4. Its source texts are
# short: on the embedded model three answers ended (EOS) 25-50 tokens into the 64-token window,
# so the rest of the window was whatever the model wrote after EOS (``ignore_eos``), and two
# answers rewrote or refused instead of editing. HF prompt lookup gained 1.05-1.14x over HF
# generate there, against 1.26x in the issue that set the targets.
COPY_SHORT = [
    "Copy the following paragraph, correcting the spelling mistakes. Keep everything else the "
    "same.\n\nSpeculative decoding lets a small draft propose several tokens at once. The large "
    "model checks all of them in a singel forward pass and keeps the longest prefix it agrees "
    "with, so the output is unchanged while fewer expensive steps are neded.",
    "Rename the variable `total` to `running_sum` in this Python function and return the whole "
    "function:\n\ndef average(numbers):\n    total = 0\n    count = 0\n    for value in numbers:\n"
    "        total = total + value\n        count = count + 1\n    if count == 0:\n"
    "        return 0.0\n    return total / count\n",
    "Repeat the following quote exactly, inside quotation marks:\n\nThe only way to make sense "
    "out of change is to plunge into it, move with it, and join the dance. Change is the law of "
    "life, and those who look only to the past or present are certain to miss the future.",
    "Turn this comma-separated list into a numbered list, one item per line: apples, bananas, "
    "cherries, dates, elderberries, figs, grapes, honeydew melons, kiwis, lemons, mangoes.",
    "Here is a JSON object:\n{\"name\": \"Ada Lovelace\", \"born\": 1815, \"field\": "
    "\"mathematics\", \"known_for\": \"the first published computer program\", \"country\": "
    "\"England\"}\nReturn the same JSON object with the field \"born\" changed to 1816.",
    "Fix the grammar in this email and return the corrected email:\n\nHello team, I wanted to "
    "let you know that the meeting are moved to thursday. Please bring you notes from last week "
    "and be ready to discuss the budget, which have changed a lot since we last talk.",
    "Add a docstring to this function and return the complete function:\n\ndef clamp(value, "
    "low, high):\n    if value < low:\n        return low\n    if value > high:\n"
    "        return high\n    return value\n",
    "Convert these lines to Markdown bullet points, keeping the text of each line:\nBuy milk and "
    "eggs\nCall the plumber about the kitchen sink\nSend the quarterly report to Maria\nBook "
    "train tickets to Lyon\nWater the plants on the balcony",
]

OPEN_ENDED = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain how photosynthesis works to a ten-year-old.",
    "Give me five tips for staying focused while working from home.",
    "Write a poem about the first snow of winter.",
    "What are the main causes of the French Revolution?",
    "Describe a day in the life of a honeybee.",
    "Why is the sky blue? Answer in a few paragraphs.",
    "Invent a new board game and describe its rules.",
]

PROMPT_KINDS = ("copy", "open", "copy_short")


def build_model(name: str, device: str, dtype: str) -> tuple[Any, Any]:
    """(model, tokenizer): a random LLaMA of real shape, or whatever ``load_model`` loads."""
    if name in RANDOM_LLAMAS:
        from transformers import AutoModelForCausalLM, LlamaConfig

        torch_dtype = torch.float32 if dtype == "float32" else torch.bfloat16
        config = LlamaConfig(**RANDOM_LLAMAS[name], max_position_embeddings=4096,
                             bos_token_id=None, eos_token_id=RANDOM_EOS_ID, pad_token_id=0)
        torch.manual_seed(0)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch_dtype,
                                                     attn_implementation="sdpa")
        return model.eval(), word_tokenizer(config.vocab_size)
    from engine.runner.loader import load_model

    return load_model(name, dtype=dtype, device=device)


def word_tokenizer(vocab_size: int) -> Any:
    """A word-level tokenizer over ``w0 .. w{vocab_size-1}`` (built offline, no files)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, "<eos>": RANDOM_EOS_ID}
    vocab.update({f"w{i}": i for i in range(2, vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.decoder = decoders.WordPiece()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="<unk>", eos_token="<eos>",
                                   pad_token="<unk>")


def random_prompt(kind: str, index: int, vocab_size: int) -> list[int]:
    """Copy-heavy: a 48-token passage twice, then its start (a prompt with something to copy);
    open-ended: 104 unrelated tokens."""
    rng = random.Random(f"{kind}-{index}")
    if kind.startswith("copy"):
        passage = [rng.randrange(2, vocab_size) for _ in range(48)]
        return passage + passage + passage[:8]
    return [rng.randrange(2, vocab_size) for _ in range(104)]


def build_prompts(kind: str, count: int, model_name: str, tokenizer: Any,
                  vocab_size: int) -> list[list[int]]:
    """``count`` prompts of ``kind`` as token ids (the texts cycle when ``count`` is larger)."""
    if kind not in PROMPT_KINDS:
        raise ValueError(f"prompt kind must be one of {PROMPT_KINDS}, got {kind!r}")
    if model_name in RANDOM_LLAMAS:
        return [random_prompt(kind, i, vocab_size) for i in range(count)]
    texts = {"copy": COPY_HEAVY, "copy_short": COPY_SHORT, "open": OPEN_ENDED}[kind]
    prompts = []
    for i in range(count):
        text = texts[i % len(texts)]
        if getattr(tokenizer, "chat_template", None) is not None:
            text = tokenizer.apply_chat_template([{"role": "user", "content": text}],
                                                 tokenize=False, add_generation_prompt=True)
            prompts.append(list(tokenizer(text, add_special_tokens=False)["input_ids"]))
        else:
            prompts.append(list(tokenizer(text)["input_ids"]))
    return prompts
