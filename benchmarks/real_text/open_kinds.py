"""Open prompts: the answer has little to copy from the prompt (stories, explanations, factual
questions, code written from a description). Names are ``<kind>-NN``."""

from __future__ import annotations

STORY = {
    "story-01": "Write a short story about a clockmaker who repairs a clock that runs backwards.",
    "story-02": "Write a story, about 300 words, in which a night-shift ferry pilot picks up a "
                "passenger who will not say where she is going.",
    "story-03": "Tell a bedtime story for a six-year-old about a hedgehog who is afraid of "
                "puddles.",
    "story-04": "Write the opening scene of a mystery novel set in a hotel lost-and-found office.",
    "story-05": "Write a short science-fiction story told entirely as entries in a "
                "maintenance log of a cargo drone.",
    "story-06": "Write a story about two neighbours who only communicate through notes left on a "
                "shared washing line.",
    "story-07": "Write a fable with a moral about a crow, a tortoise and a borrowed umbrella.",
    "story-08": "Write a short story in the second person about the last day before a family "
                "moves to another country.",
    "story-09": "Write a ghost story set in a closed-down roller-skating rink, without any "
                "violence.",
    "story-10": "Write a story about a glassblower's apprentice who breaks the most valuable "
                "piece in the workshop on her first day.",
    "story-11": "Write a comic story about a town whose only traffic light has started "
                "expressing opinions.",
    "story-12": "In about 200 words, write a story that begins with the sentence: 'The "
                "envelope had been posted forty years too late.'",
    "story-13": "Write a story about a retired locksmith who is asked to open a safe that "
                "nobody admits to owning.",
    "story-14": "Write a short adventure story for teenagers about a hot-air balloon race that "
                "goes off course over a salt marsh.",
    "story-15": "Write a quiet, realistic story about an old man teaching his granddaughter to "
                "tie sailors' knots in a kitchen.",
    "story-16": "Write a story in which a crossword setter hides a message for someone in the "
                "Saturday puzzle.",
}

EXPLAIN = {
    "explain-01": "Explain how a refrigerator keeps food cold, step by step.",
    "explain-02": "Why does ice float on water when most solids sink in their own liquid?",
    "explain-03": "Explain how a GPS receiver works out where it is.",
    "explain-04": "Explain compound interest with a worked example, for someone who has just "
                  "opened their first savings account.",
    "explain-05": "How do noise-cancelling headphones cancel noise?",
    "explain-06": "Explain what a hash table is and why looking up a key is usually fast.",
    "explain-07": "Why do leaves change colour in autumn? Keep it under 250 words.",
    "explain-08": "Explain how soap removes grease from your hands.",
    "explain-09": "Explain how a pin tumbler lock and its key work.",
    "explain-10": "What is inflation, and why do central banks try to keep it low but not at "
                  "zero?",
    "explain-11": "Explain how a microwave oven heats food, and why some dishes heat unevenly.",
    "explain-12": "Explain why the moon has phases, using a lamp and a ball as an analogy.",
    "explain-13": "Explain the difference between a virus and a bacterium to a secondary school "
                  "student.",
    "explain-14": "Explain how a zip fastener works and why it sometimes splits open.",
    "explain-15": "Explain what recursion is in programming, with one small example that is not "
                  "the factorial function.",
    "explain-16": "Why do water pipes sometimes burst during a hard frost? Explain the physics.",
}

FACTUAL = {
    "factual-01": "What is the capital of Australia, and why is it not Sydney?",
    "factual-02": "How many bones does an adult human have, and how many does a newborn have?",
    "factual-03": "Which metal is liquid at room temperature? Name one more element that is.",
    "factual-04": "What causes the northern lights?",
    "factual-05": "How deep is the Mariana Trench, approximately, in metres?",
    "factual-06": "What is a leap year, and what is the rule for century years?",
    "factual-07": "What is the chemical symbol for tungsten and where does it come from?",
    "factual-08": "Who wrote the novel 'Frankenstein', and in which year was it first published?",
    "factual-09": "What is the speed of sound in dry air at 20 degrees Celsius?",
    "factual-10": "What is the largest organ of the human body?",
    "factual-11": "What is the difference between a comet and an asteroid? Answer in two "
                  "sentences.",
    "factual-12": "Which is the longest bone in the human body, and roughly how long is it?",
    "factual-13": "What does the abbreviation DNA stand for?",
    "factual-14": "How tall is Mount Kilimanjaro, and in which country is it?",
    "factual-15": "What is the boiling point of water at the top of a high mountain compared "
                  "with sea level, and why?",
    "factual-16": "Name the noble gases in order of atomic number.",
}

CODE_WRITE = {
    "code_write-01": "Write a Python function that checks whether a string is a palindrome, "
                     "ignoring case, spaces and punctuation.",
    "code_write-02": "Write a Python function `merge_intervals(intervals)` that merges "
                     "overlapping closed intervals given as a list of (start, end) pairs.",
    "code_write-03": "Write a JavaScript function that debounces another function: calls made "
                     "within `wait` milliseconds of each other run only once, after the last.",
    "code_write-04": "Write a SQL query that returns, for each department, the employee with the "
                     "highest salary. The table is employees(id, name, department, salary).",
    "code_write-05": "Write a Python class `LRUCache` with `get(key)` and `put(key, value)` that "
                     "evicts the least recently used entry when it holds more than `capacity`.",
    "code_write-06": "Write a bash script that prints the ten largest files under a directory "
                     "given as its first argument, with their sizes in human-readable form.",
    "code_write-07": "Write a Python function that reads a CSV file of transactions with "
                     "columns date, category, amount and returns the total amount per category.",
    "code_write-08": "Write a Rust function that returns the n-th Fibonacci number as a u64, "
                     "iteratively, and a test for it.",
    "code_write-09": "Write a Python generator that yields the prime numbers in increasing order "
                     "without an upper limit.",
    "code_write-10": "Write a regular expression that matches dates in the form YYYY-MM-DD with "
                     "a month from 01 to 12, and show how to use it in Python.",
    "code_write-11": "Write a C function that reverses a null-terminated string in place.",
    "code_write-12": "Write a Python function that flattens an arbitrarily nested list of "
                     "integers into one list, without recursion.",
    "code_write-13": "Write a small Flask app with one endpoint, GET /health, that returns "
                     "{\"status\": \"ok\"} as JSON.",
    "code_write-14": "Write a Go function that counts how often each word occurs in a string, "
                     "ignoring case, and returns a map.",
    "code_write-15": "Write a Python function `chunked(items, size)` that splits a list into "
                     "consecutive chunks of at most `size` elements, with doctest examples.",
    "code_write-16": "Write a TypeScript interface for a blog post (title, author, tags, "
                     "published date, optional summary) and a function that sorts posts by date, "
                     "newest first.",
}
