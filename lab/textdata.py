"""Text for the character-level language-model task `text`: the built-in text, validation, the vocabulary,
the train / held-out split and the unigram entropy a model must beat.

A character-level language model reads a text one character at a time and predicts the next one
(Karpathy's char-rnn, 2015; minGPT's projects/chargpt): the vocabulary is the set of distinct characters,
sorted so that a text always gets the same token ids. The user's text is a config field (task.text), so
it is stored in the run's config.json and the run stays reproducible; an empty field means the built-in
text, which the project writes itself from a tiny grammar with a fixed seed (no download, works offline).
The first 90% of the text is for training, the last 10% is held out.

Plain Python, no torch (lab/config.py validates with it; lab/tasks/batches.py samples the windows).
"""
from __future__ import annotations

import functools
import hashlib
import math
import random
import re
from collections import Counter

from lab.fields import ConfigError

MIN_CHARS = 200  # so that the held-out part (the last 10%) holds a window
MAX_CHARS = 100_000
MAX_DISTINCT = 200  # distinct characters: the vocabulary, so the embedding and the head stay small
HELD_OUT = 0.1  # the last tenth of the text is the held-out split
SPLIT = f"the first {1 - HELD_OUT:.0%} trains, the last {HELD_OUT:.0%} is held out"  # HELD_OUT in words
ALLOWED = (f"{MIN_CHARS:,} to {MAX_CHARS:,} characters of printable text, newlines and tabs, at most "
           f"{MAX_DISTINCT} distinct ones; or empty for the built-in text")
# control characters other than tab and newline (C0, DEL, C1) and lone surrogates (no valid text has them)
_REFUSED = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff]")
_LABELS = {" ": "␣", "\n": "⏎", "\t": "⇥"}  # readable labels of the invisible characters
SEED = 2024


# ---- the built-in text: sentences from a tiny grammar -----------------------------------------
# Singular and plural forms: subject and verb agree, "a" becomes "an" before a vowel; a model that
# predicts well must learn spelling, word boundaries, agreement and sentence shape.
NOUNS = {"cat": "cats", "dog": "dogs", "bird": "birds", "child": "children", "teacher": "teachers",
         "fox": "foxes", "owl": "owls", "mouse": "mice", "farmer": "farmers", "robot": "robots"}
THINGS = {"ball": "balls", "box": "boxes", "apple": "apples", "tree": "trees", "book": "books",
          "river": "rivers", "garden": "gardens", "egg": "eggs", "house": "houses"}
ADJECTIVES = ("small", "big", "red", "green", "old", "young", "quiet", "happy", "odd", "empty")
VERBS = {"sees": "see", "likes": "like", "finds": "find", "carries": "carry", "watches": "watch",
         "follows": "follow", "wants": "want", "paints": "paint"}
INTRANSITIVE = {"sleeps": "sleep", "runs": "run", "sings": "sing", "waits": "wait", "laughs": "laugh"}
PLACES = ("near", "under", "behind", "inside", "beside")
ADVERBS = ("today", "again", "slowly", "at night", "every morning")
DET_ONE, DET_MANY = ("the", "a", "every", "this", "one"), ("the", "some", "two", "many", "these")


def _noun_phrase(rng: random.Random, nouns: dict[str, str], plural: bool) -> str:
    words = [rng.choice(DET_MANY if plural else DET_ONE)]
    for _ in range(rng.choices((0, 1, 2), (5, 4, 1))[0]):
        words.append(rng.choice(ADJECTIVES))
    noun = rng.choice(list(nouns))
    words.append(nouns[noun] if plural else noun)
    if words[0] == "a" and words[1][0] in "aeiou":
        words[0] = "an"
    return " ".join(words)


def _clause(rng: random.Random) -> str:
    plural = rng.random() < 0.4
    subject = _noun_phrase(rng, NOUNS, plural)
    if rng.random() < 0.65:
        verb = rng.choice(list(VERBS))
        words = [subject, VERBS[verb] if plural else verb, _noun_phrase(rng, THINGS, rng.random() < 0.4)]
    else:
        verb = rng.choice(list(INTRANSITIVE))
        words = [subject, INTRANSITIVE[verb] if plural else verb]
    if rng.random() < 0.3:
        words += [rng.choice(PLACES), _noun_phrase(rng, THINGS, rng.random() < 0.3)]
    if rng.random() < 0.25:
        words.append(rng.choice(ADVERBS))
    return " ".join(words)


def _sentence(rng: random.Random) -> str:
    text = _clause(rng)
    if rng.random() < 0.15:
        text += rng.choice((", and ", ", but ")) + _clause(rng)
    return text[0].upper() + text[1:] + rng.choice((".", ".", ".", ".", "!"))


@functools.lru_cache(maxsize=1)
def builtin_text(n_chars: int = 30_000, seed: int = SEED) -> str:
    """About `n_chars` characters of sentences from the grammar above, 1 to 4 a line, whole lines only:
    the same text on every machine (Python's `random.Random` with a fixed seed)."""
    rng, lines, size = random.Random(seed), [], 0
    while size < n_chars:
        line = " ".join(_sentence(rng) for _ in range(rng.randint(1, 4)))
        lines.append(line)
        size += len(line) + 1
    return "\n".join(lines) + "\n"


# ---- validation ---------------------------------------------------------------------------------
def check_text(text: object, field: str = "task.text") -> None:
    """ConfigError naming `field` unless `text` is a valid text for the task (see ALLOWED)."""
    if not isinstance(text, str):
        raise ConfigError(field, f"is not text (allowed: {ALLOWED})")
    if text and not MIN_CHARS <= len(text) <= MAX_CHARS:  # before the cache: it never holds an oversized text
        raise ConfigError(field, f"is {len(text):,} characters long (allowed: {ALLOWED})")
    problem = _problem(text) if text else ""
    if problem:
        raise ConfigError(field, problem)


@functools.lru_cache(maxsize=64)
def _problem(text: str) -> str:
    """What is wrong with the characters of `text`, or '' (cached: a config is validated each time it is
    built, and its text is the same each time)."""
    bad = _REFUSED.search(text)
    if bad:
        line = text.count("\n", 0, bad.start()) + 1
        return (f"contains the control character U+{ord(bad.group()):04X} on line {line}, as a binary file "
                f"would (allowed: {ALLOWED})")
    distinct = len(set(text))
    if distinct > MAX_DISTINCT:
        return f"has {distinct} distinct characters (allowed: at most {MAX_DISTINCT})"
    return ""


def text_of(text: str) -> str:
    """The text a config means: its own, or the built-in one when empty."""
    return text or builtin_text()


# ---- vocabulary and the split -------------------------------------------------------------------
@functools.lru_cache(maxsize=16)
def vocabulary(text: str) -> tuple[str, ...]:
    """The distinct characters of `text`, sorted by code point: token id i is `vocabulary(text)[i]`."""
    return tuple(sorted(set(text)))


def char_label(ch: str) -> str:
    """A character as the app shows it: '␣' for a space, '⏎' for a newline, '⇥' for a tab."""
    return _LABELS.get(ch, ch)


def encode(text: str, vocab: tuple[str, ...], field: str = "probe") -> list[int]:
    """Characters -> token ids; ConfigError naming `field` for a character the vocabulary lacks."""
    index = {c: i for i, c in enumerate(vocab)}
    missing = [c for c in text if c not in index]
    if missing:
        shown = "".join(char_label(c) for c in vocab[:40]) + ("…" if len(vocab) > 40 else "")
        raise ConfigError(field, f"{char_label(missing[0])!r} is not a character of the text "
                                 f"(allowed: {shown})")
    return [index[c] for c in text]


def decode(tokens: list[int], vocab: tuple[str, ...]) -> str:
    """Token ids -> the characters they stand for."""
    return "".join(vocab[t] for t in tokens)


def split_at(text: str) -> int:
    """Where the held-out part begins: the first 90% of the characters train, the rest is held out."""
    return len(text) - max(1, int(len(text) * HELD_OUT))


def held_out_len(text: str) -> int:
    return len(text) - split_at(text)


# ---- numbers about a text -----------------------------------------------------------------------
def unigram_entropy_nats(text: str) -> float:
    """H = -sum_c p(c) ln p(c) over the character frequencies of `text`, in nats (the unit of the model's
    cross-entropy loss): the loss of the best model that ignores context. A language model that beats it
    has learned something from the preceding characters (Shannon 1951, "Prediction and entropy of
    printed English")."""
    n = len(text)
    return -sum(k / n * math.log(k / n) for k in Counter(text).values()) if n else 0.0


@functools.lru_cache(maxsize=16)
def training_unigram_entropy(text: str) -> float:
    """The unigram entropy (nats) of the text's training part, its first 90%: the loss baseline of its
    held-out and training curves (lab/tasks/shapes.py loss_baselines)."""
    return unigram_entropy_nats(text[:split_at(text)])


def short_form(text: str, head: int = 24) -> str:
    """A text as tables, labels and listings show it: its first characters, its length and a short hash
    ('The small cat sees a r… (12,345 chars #1a2b3c)'); '' stays '' (the built-in text)."""
    if not text:
        return ""
    start = "".join(char_label(c) if c in "\n\t" else c for c in text[:head])
    digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:6]
    return f"{start}{'…' if len(text) > head else ''} ({len(text):,} chars #{digest})"
