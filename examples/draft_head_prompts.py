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
    "Write a news headline and a short article about {t}.",
    "What questions would a curious student ask about {t}? Answer two of them.",
    "Compare {t} with something similar and explain the differences.",
    "Write a limerick about {t}.",
    "Correct the grammar: 'Me and my friend is very interesting in {t} since many year.'",
    "Continue this text: 'Nobody expected that {t} would change everything, but'",
    "Write a short speech for a school event about {t}.",
    "Give a recipe, a plan or a checklist that has something to do with {t}.",
    "Describe {t} using only simple words.",
    "Write a review of a book about {t}.",
    "What are common misconceptions about {t}?",
    "Write a tweet, a haiku and a slogan about {t}.",
    "Explain how {t} works, in numbered steps.",
    "Write a job advertisement for a position involving {t}.",
    "Make a word problem in mathematics about {t} and solve it.",
    "Write a JSON object that describes {t} with five fields.",
    "Write a letter of complaint about {t}.",
    "Give the pros and cons of {t} as a markdown table.",
    "Tell a joke about {t} and explain why it is funny.",
    "Write a scene of a play set in a place connected to {t}.",
    "If you could ask an expert on {t} one question, what would it be and why?",
    "Write instructions for a child on how to draw {t}.",
    "Summarize in one sentence, then in one paragraph: what is {t}?",
    "Write a SQL table definition and three rows of data about {t}.",
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
    "tea", "hospitals", "bridges", "social media", "the French Revolution", "elephants",
    "climate change", "cooking pasta", "knitting", "astronomy", "taxes", "rock music",
    "the printing of money", "wolves", "running a marathon", "smartphones", "volunteering",
    "the Great Wall of China", "snow", "pirates", "fungi", "nuclear power", "poetry",
    "city parks", "ants", "the Renaissance", "cybersecurity", "camping", "the postal service",
    "whales", "board games", "wind turbines", "fashion", "the immune system", "carpentry",
    "glaciers", "opera", "electric guitars", "submarines", "spices", "rainbows", "democracy",
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
