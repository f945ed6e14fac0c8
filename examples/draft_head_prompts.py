"""A diverse, offline prompt set for training a draft head: tasks crossed with topics.

Every prompt is built here from word lists (no download, same list on every machine). Held-out
prompts use topics that no training prompt uses, so the held-out acceptance measures text the
head has not seen. The topics of the benchmark's open-ended prompts (lighthouses,
photosynthesis, honeybees, the French Revolution, snow, board games:
``benchmarks/workloads.py``) are in neither set.

*Copy tasks* (:func:`copy_prompts`) ask the target to repeat, quote or lightly edit a text given
in the prompt: the target's own answer to another prompt, so that they too are built offline.
In such answers most tokens are copied from the prompt, which a head learns only by seeing it
(the first head, trained on open prompts alone, accepted 0.47 drafts of 4 on the benchmark's
copy-heavy prompts against 0.96 on its open ones).
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

# Copy tasks over a given text: {text} as it is, {typos} with misspelt words, {a} -> {b} a word
# of the text and its replacement.
COPY_TASKS = [
    "Repeat the following text exactly:\n\n{text}",
    "Quote this passage word for word, inside quotation marks:\n\n{text}",
    "Correct the spelling mistakes in this text and return the whole text:\n\n{typos}",
    "Fix any grammar mistakes in this text, keep everything else the same, and return it:"
    "\n\n{typos}",
    "Rewrite this text with each sentence on its own line:\n\n{text}",
    "Turn the sentences of this text into a bulleted list:\n\n{text}",
    "Replace every \"{a}\" with \"{b}\" in this text and return the result:\n\n{text}",
    "Add a title at the top of this text and return it otherwise unchanged:\n\n{text}",
    "Return this text in a Markdown block quote:\n\n{text}",
    "Make this text more formal, changing as few words as possible:\n\n{text}",
    "Here is a text:\n\n{text}\n\nCopy its first two sentences, then summarize the rest in "
    "one sentence.",
    "Translate the first sentence of this text into French, then copy the rest unchanged:"
    "\n\n{text}",
]
REPLACEMENTS = ["thing", "item", "idea", "person", "place", "moment", "object", "system"]
COPY_CHARS = 700  # a copy task's text: at most this many characters, cut at a sentence's end


def copy_prompts(texts: list[str], seed: int = 0) -> list[str]:
    """A copy task (:data:`COPY_TASKS`) over each non-empty text, cut to about
    :data:`COPY_CHARS` characters at a sentence's end."""
    rng = random.Random(seed)
    out = []
    for text in texts:
        text = _cut(text.strip())
        words = [w for w in text.split() if len(w) >= 4 and w.isalnum()]
        if len(text) < 40 or not words:
            continue
        a = rng.choice(words)
        task = rng.choice(COPY_TASKS)
        out.append(task.format(text=text, typos=_typos(text, rng), a=a,
                               b=rng.choice([r for r in REPLACEMENTS if r != a])))
    return out


def _cut(text: str) -> str:
    if len(text) <= COPY_CHARS:
        return text
    end = max(text.rfind(c, 0, COPY_CHARS) for c in ".!?\n")
    return text[:end + 1] if end > COPY_CHARS // 3 else text[:COPY_CHARS]


def _typos(text: str, rng: random.Random, rate: float = 0.08) -> str:
    """``text`` with about ``rate`` of its longer words misspelt (two inner letters swapped,
    or one dropped)."""
    words = text.split(" ")
    for i, w in enumerate(words):
        if len(w) >= 5 and w.isalpha() and rng.random() < rate:
            j = rng.randrange(1, len(w) - 2)
            words[i] = (w[:j] + w[j + 1] + w[j] + w[j + 2:] if rng.random() < 0.5
                        else w[:j] + w[j + 1:])
    return " ".join(words)

TOPICS = [
    "the ocean", "volcanoes", "the moon landing", "chess", "bread baking",
    "electric cars", "the Roman Empire", "jazz music", "rain forests", "black holes",
    "recycling", "the human heart", "mountain climbing", "coffee", "origami", "trains",
    "the internet", "dinosaurs", "gardening", "the Olympic Games",
    "penguins", "solar panels", "ancient Egypt", "video games", "friendship", "libraries",
    "earthquakes", "the piano", "public transport", "cheese", "robots", "the Arctic",
    "birthdays", "sleep", "bicycles", "clouds", "the printing press", "time zones",
    "vaccines", "mathematics", "deserts", "kites", "museums", "teamwork",
    "chocolate", "airplanes", "sourdough", "owls", "the stock market", "football",
    "painting", "rivers", "the weather", "space stations", "farming", "languages", "maps",
    "tea", "hospitals", "bridges", "social media", "elephants",
    "climate change", "cooking pasta", "knitting", "astronomy", "taxes", "rock music",
    "the printing of money", "wolves", "running a marathon", "smartphones", "volunteering",
    "the Great Wall of China", "pirates", "fungi", "nuclear power", "poetry",
    "city parks", "ants", "the Renaissance", "cybersecurity", "camping", "the postal service",
    "whales", "wind turbines", "fashion", "the immune system", "carpentry",
    "glaciers", "opera", "electric guitars", "submarines", "spices", "rainbows", "democracy",
    "sailing", "architecture", "meditation", "the violin", "tigers", "deep sea fish",
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
