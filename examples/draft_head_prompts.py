"""A diverse, offline prompt set for training a draft head: tasks crossed with topics.

Every prompt is built here from word lists (no download, same list on every machine). Held-out
prompts use topics that no training prompt uses, so the held-out acceptance measures text the
head has not seen.
"""

from __future__ import annotations

import random

TASKS = [
    "Write a short story about {t}.",
    "Explain {t} to a ten-year-old.",
    "List five interesting facts about {t}.",
    "Write a poem about {t}.",
    "What are the advantages and disadvantages of {t}?",
    "Describe a typical day of someone who works with {t}.",
    "Give me three tips for getting started with {t}.",
    "Write an email to a friend telling them about {t}.",
    "Summarize the history of {t} in a paragraph.",
    "Write a dialogue between two people arguing about {t}.",
    "Answer briefly: why do people care about {t}?",
    "Write a product description for something related to {t}.",
    "Create a quiz with three questions about {t}, with answers.",
    "Write a Python function related to {t}, with a docstring and a short example.",
    "Translate this sentence into French and explain the grammar: 'I like {t}.'",
    "Give a step-by-step plan to learn about {t} in one month.",
]

TOPICS = [
    "the ocean", "volcanoes", "honeybees", "the moon landing", "chess", "bread baking",
    "electric cars", "the Roman Empire", "jazz music", "rain forests", "black holes",
    "recycling", "the human heart", "mountain climbing", "coffee", "origami", "trains",
    "the internet", "dinosaurs", "photosynthesis", "gardening", "the Olympic Games",
    "penguins", "solar panels", "ancient Egypt", "video games", "friendship", "libraries",
    "earthquakes", "the piano", "public transport", "cheese", "robots", "the Arctic",
    "birthdays", "sleep", "bicycles", "clouds", "the printing press", "time zones",
    "vaccines", "mathematics", "deserts", "kites", "museums", "teamwork", "lighthouses",
    "chocolate", "airplanes", "sourdough", "owls", "the stock market", "football",
    "painting", "rivers", "the weather", "space stations", "farming", "languages", "maps",
]


def draft_head_prompts(num_prompts: int, held_out_fraction: float = 0.1,
                       seed: int = 0) -> tuple[list[str], list[str]]:
    """``(train, held_out)`` prompts: ``num_prompts`` in all, the held-out ones about topics
    that no training prompt is about."""
    rng = random.Random(seed)
    topics = TOPICS[:]
    rng.shuffle(topics)
    num_held = max(1, round(len(topics) * held_out_fraction))
    held_topics, train_topics = topics[:num_held], topics[num_held:]

    def cross(topic_list: list[str]) -> list[str]:
        prompts = [task.format(t=t) for t in topic_list for task in TASKS]
        rng.shuffle(prompts)
        return prompts

    train, held = cross(train_topics), cross(held_topics)
    num_held_prompts = max(1, round(num_prompts * held_out_fraction))
    return train[:num_prompts - num_held_prompts], held[:num_held_prompts]
