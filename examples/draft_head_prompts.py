"""A diverse, offline prompt set for training a draft head: families of templates crossed
with word lists (:mod:`examples.draft_head_topics`).

Every prompt is built here from word lists (no download, same list on every machine). Most are
prose, the draft head's weak spot (:data:`PROSE_KINDS`): stories, poems, explanations, factual
questions, advice, letters, descriptions, dialogues, arguments; then code, and the first set's
tasks crossed with topics (``template``). :data:`FAMILIES` gives each family its share of the
prompts. Held-out prompts take every *subject* (a character, a situation, a mechanism, a place,
...) from a part of each word list that no training prompt takes, so the held-out acceptance
measures text the head has not seen; styles (genres, forms, audiences, languages) are shared. No
prompt equals, contains or shares a topic with a benchmark prompt (``benchmarks/real_text/``,
both splits, and ``benchmarks/workloads.py``): ``tests/examples/test_draft_head_prompts.py``.

Two more kinds are built from the target's own answers, so that they too are built offline:

- *copy tasks* (:func:`copy_prompts`): repeat, quote, lightly edit, rewrite or summarise a text
  given in the prompt. In such answers most tokens are copied from the prompt, which a head
  learns only by seeing it (the first head, trained on open prompts alone, accepted 0.47 drafts
  of 4 on the benchmark's copy-heavy prompts against 0.96 on its open ones);
- *multi-turn chats* (:func:`multi_turn_prompts`): a prompt, the target's answer to it, and a
  last user turn that asks for that answer back changed, or moves on to another prompt.
"""

from __future__ import annotations

import random
import string
from dataclasses import dataclass

from examples import draft_head_topics as topics

# One user message, or a conversation (user, assistant, ..., user) as chat messages.
Chat = str | list[dict[str, str]]

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
    "Summarise this text in two or three sentences:\n\n{text}",
    "Rewrite this text so that a young child could follow it, keeping its meaning:\n\n{text}",
    "Quote the most important sentence of this text, then say in your own words why it "
    "matters:\n\n{text}",
    "Rewrite this text in a cheerful, chatty tone:\n\n{text}",
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



@dataclass(frozen=True)
class Family:
    """A kind of prompt: its templates (slots named after :data:`POOLS`, ``other_x`` a second,
    different entry of pool ``x``) and its share of the prompt set."""

    kind: str
    share: float
    templates: tuple[str, ...]


FAMILIES = (
    Family("story", 0.22, (
        "Write a short story about {character} who {situation}.",
        "Write a {genre} story about {character} who {situation}.",
        "Write a {genre} story set in {setting}.",
        "Write a story set in {setting} in which {character} {situation}.",
        "Write a story about {character}, told as {form}.",
        "Tell a story, as {form}, about {character} who {situation}.",
        "Write a story of about 250 words whose first line is: '{opening}'",
        "Continue this story for a few paragraphs: '{opening}'",
        "Use this sentence to start a {genre} story: '{opening}'",
        "Write a bedtime story about {animal} who {situation}, for a young child.",
        "Write a fable about {animal} and {other_animal} that ends with a moral.",
        "Write a story told from the point of view of {object}.",
        "Write a very short story, under 150 words, about {character} and {other_character}.",
        "Write the first page of a {genre} novel whose hero is {character}.",
        "Write a poem about {poem}.",
        "Write a free-verse poem about {poem}.",
        "Write a rhyming poem for children about {animal} who {situation}.",
    )),
    Family("explain", 0.15, (
        "Explain how {mechanism} works.",
        "How does {mechanism} work? Explain it step by step.",
        "Explain how {mechanism} works to {audience}.",
        "Why {phenomenon}?",
        "Why {phenomenon}? Please explain in a few paragraphs.",
        "Why {phenomenon}? Explain it to {audience}.",
        "Explain {concept} to {audience}.",
        "What is meant by {concept}? Give an everyday example.",
        "Explain {concept} in a few paragraphs.",
        "What is the difference between {pair}?",
        "Explain the difference between {pair}, with an example of each.",
        "Explain step by step how {process}.",
        "Describe how {process}, from start to finish.",
    )),
    Family("factual", 0.11, (
        "{question}",
        "Tell me about {place}.",
        "What is {place} known for?",
        "Where is {place}, and what is special about it?",
        "Who was {person}, and why are they remembered?",
        "Write a short biography of {person}.",
        "What did {person} achieve?",
        "What happened during {event}?",
        "Why was {event} important?",
        "Tell me some facts about {creature}.",
        "Where does {creature} live, and what does it eat?",
        "How does {creature} survive in the wild?",
    )),
    Family("advice", 0.07, (
        "I want to start {activity}. What advice would you give a beginner?",
        "Give me some tips for {activity}.",
        "What do I need to know before I take up {activity}?",
        "Can you give me advice on {life}?",
        "I need help with {life}. What should I do?",
        "Any tips for {life}? Please be practical.",
        "What are the mistakes beginners make with {activity}?",
        "How should I prepare for {life}?",
    )),
    Family("letter", 0.07, (
        "Write an email to {recipient} {purpose}.",
        "Write a short, friendly message to {recipient} {purpose}.",
        "Write a formal letter to {recipient} {purpose}.",
        "Write a cover letter for a job as {job}.",
        "Write a thank-you card to {recipient}, {purpose}.",
    )),
    Family("describe", 0.06, (
        "Describe {scene}.",
        "Describe the sights, sounds and smells of {scene}.",
        "Write a descriptive paragraph about {scene}.",
        "Write a product description for {product}.",
        "Write an advertisement for {product}.",
        "What is a normal working day like for {job}?",
        "Describe {place} to someone who has never been there.",
        "Describe a morning in {setting}.",
        "Write a travel blog post about a day in {place}.",
    )),
    Family("dialogue", 0.04, (
        "Write a dialogue between {character} and {other_character} about {issue}.",
        "Write a short scene for a play in which {character} meets {other_character} in "
        "{setting}.",
        "Write a conversation between {character} and {job} in which one of them {situation}.",
        "Write an imagined interview with {person} about their life and work.",
    )),
    Family("discuss", 0.04, (
        "What are the arguments for and against {issue}?",
        "Write a short essay on {issue}.",
        "What do you think about {issue}? Give both sides and your conclusion.",
        "Write a letter to a newspaper editor about {issue}.",
        "Explain why some people support {issue} and others oppose it.",
        "Write an opinion piece for a local newspaper about {issue}.",
    )),
    Family("code", 0.10, (
        "Write a {language} function that {code}.",
        "Write a {language} function that {code}, with comments.",
        "Write a Python function that {code}, with a docstring and an example.",
        "Write a {language} program that {code}, and explain how it works.",
        "Write unit tests for a Python function that {code}.",
        "Write a SQL query that {sql}.",
        "Write a bash script that {shell}.",
    )),
    Family("template", 0.14, tuple(TASKS)),
)
PROSE_KINDS = frozenset({"story", "explain", "factual", "advice", "letter", "describe",
                         "dialogue", "discuss"})

# slot (a template's field, ``other_`` removed) -> its word list
POOLS: dict[str, list[str]] = {
    "t": topics.TOPICS, "character": topics.CHARACTERS, "situation": topics.SITUATIONS,
    "setting": topics.SETTINGS, "genre": topics.GENRES, "form": topics.FORMS,
    "opening": topics.OPENINGS, "object": topics.OBJECTS, "animal": topics.ANIMALS,
    "poem": topics.POEM_SUBJECTS, "mechanism": topics.MECHANISMS,
    "phenomenon": topics.PHENOMENA, "concept": topics.CONCEPTS, "audience": topics.AUDIENCES,
    "pair": topics.PAIRS, "process": topics.PROCESSES, "issue": topics.ISSUES,
    "place": topics.PLACES, "person": topics.PEOPLE, "event": topics.EVENTS,
    "creature": topics.CREATURES, "question": topics.QUESTIONS, "activity": topics.ACTIVITIES,
    "life": topics.LIFE_SITUATIONS, "recipient": topics.RECIPIENTS, "purpose": topics.PURPOSES,
    "job": topics.JOBS, "scene": topics.SCENES, "product": topics.PRODUCTS,
    "language": topics.LANGUAGES, "code": topics.CODE_TASKS, "sql": topics.SQL_TASKS,
    "shell": topics.SHELL_TASKS,
}


@dataclass(frozen=True)
class HeadPrompt:
    """One prompt of the set: its family's kind, the chat, and the subjects it is about (the
    entries of split word lists it took)."""

    kind: str
    chat: Chat
    subjects: tuple[str, ...] = ()


def slots(template: str) -> list[str]:
    """The fields of ``template``, in order."""
    return [name for _, name, _, _ in string.Formatter().parse(template) if name]


def draft_head_prompts(num_prompts: int, held_out_fraction: float = 0.1,
                       seed: int = 0) -> tuple[list[HeadPrompt], list[HeadPrompt]]:
    """``(train, held_out)`` prompts, ``num_prompts`` in all (fewer only where a family runs out
    of combinations), shuffled: each family its share of both. Held-out prompts take their
    subjects from a part (``held_out_fraction``) of every split word list that no training
    prompt takes."""
    rng = random.Random(seed)
    held_entries = set()  # (an entry of two lists is held out from both)
    for name, pool in POOLS.items():
        if name not in topics.STYLE_POOLS:
            pool = pool[:]
            rng.shuffle(pool)
            held_entries.update(pool[:max(1, round(len(pool) * held_out_fraction))])
    # (a head fine-tuned from the first one, --init, must not be measured on what that one
    # learnt: its topics stay on the training side of every list that also has them)
    held_entries -= first_head_topics()
    train_pools, held_pools = {}, {}
    for name, pool in POOLS.items():
        if name in topics.STYLE_POOLS:
            train_pools[name] = held_pools[name] = pool
        else:
            held_pools[name] = [e for e in pool if e in held_entries]
            train_pools[name] = [e for e in pool if e not in held_entries]
    num_held = max(1, round(num_prompts * held_out_fraction))
    train, held, seen = [], [], set()
    for family, n_train, n_held in zip(FAMILIES, shares(num_prompts - num_held),
                                       shares(num_held), strict=True):
        train += _family_prompts(family, train_pools, n_train, rng, seen)
        held += _family_prompts(family, held_pools, n_held, rng, seen)
    rng.shuffle(train)
    rng.shuffle(held)
    return train, held


def first_head_topics() -> set[str]:
    """The topics the first shipped head was trained on: every ``topics.TOPICS`` entry but the
    tenth its split held out (the prompt set before this one: ``TOPICS`` shuffled by
    ``random.Random(0)``, the first tenth held out)."""
    shuffled = topics.TOPICS[:]
    random.Random(0).shuffle(shuffled)
    return set(shuffled[max(1, round(len(shuffled) * 0.1)):])


def shares(total: int) -> list[int]:
    """``total`` split between :data:`FAMILIES` by their shares (largest remainders)."""
    exact = [f.share * total / sum(f.share for f in FAMILIES) for f in FAMILIES]
    counts = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: counts[i] - exact[i])
    for i in by_remainder[:total - sum(counts)]:
        counts[i] += 1
    return counts


def _family_prompts(family: Family, pools: dict[str, list[str]], count: int,
                    rng: random.Random, seen: set[str]) -> list[HeadPrompt]:
    """``count`` prompts of ``family`` not in ``seen`` (templates and entries drawn at random;
    added to ``seen``), or as many as 50 draws a prompt find."""
    out = []
    for _ in range(50 * count):
        if len(out) == count:
            break
        template = rng.choice(family.templates)
        fields = {}
        for name in slots(template):
            pool = pools[name.removeprefix("other_")]
            fields[name] = rng.choice(pool)
        if len(set(fields.values())) < len(fields):  # (x and other_x the same entry)
            continue
        text = template.format(**fields)
        if text not in seen:
            seen.add(text)
            subjects = tuple(v for k, v in fields.items()
                             if k.removeprefix("other_") not in topics.STYLE_POOLS)
            out.append(HeadPrompt(family.kind, text[0].upper() + text[1:], subjects))
    return out


# A multi-turn chat's last user turn: one that asks for the answer back, changed ({a} -> {b}:
# a word of it and its replacement), or one that moves on to another prompt ({next}).
FOLLOW_UPS = [
    "Make that shorter, about half the length.",
    "Give it a title and show me the whole text again.",
    "Please rewrite that in a more formal tone.",
    "Now rewrite it so that a young child could understand it.",
    "Can you turn that into a bulleted list?",
    "Thanks. Can you sum that up in two sentences?",
    "Repeat your answer, but replace every \"{a}\" with \"{b}\".",
    "Add one more paragraph at the end.",
    "What is the most important point in what you just wrote?",
    "Could you explain the second part in more detail?",
    "I like it. Write it again, but from a different point of view.",
    "That is helpful, thank you. {next}",
    "Thank you! On another subject: {next}",
    "Great. Now something else. {next}",
    "OK, noted. {next}",
]


def multi_turn_prompts(pairs: list[tuple[str, str]], others: list[str],
                       seed: int = 0) -> list[list[dict[str, str]]]:
    """A chat for each ``(prompt, answer)`` pair with an answer (cut as copy tasks cut their
    texts): the prompt, the answer as the assistant's turn, and a last user turn
    (:data:`FOLLOW_UPS`); one that moves on asks one of ``others``."""
    rng = random.Random(seed)
    out = []
    for prompt, answer in pairs:
        answer = _cut(answer.strip())
        words = [w for w in answer.split() if len(w) >= 4 and w.isalnum()]
        if len(answer) < 40 or not words:
            continue
        a = rng.choice(words)
        last = rng.choice(FOLLOW_UPS).format(
            a=a, b=rng.choice([r for r in REPLACEMENTS if r != a]), next=rng.choice(others))
        out.append([{"role": "user", "content": prompt},
                    {"role": "assistant", "content": answer},
                    {"role": "user", "content": last}])
    return out
