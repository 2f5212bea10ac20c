"""A deterministic, English-like corpus: the zoo's stand-in for downloaded text.

Words are built from syllables by a seeded generator, sentences draw words with a Zipf-like
skew, so token statistics resemble text (a few very common words, a long tail) while nothing is
read from the network.
"""

from __future__ import annotations

import random

_ONSETS = ("", "b", "c", "d", "f", "g", "h", "l", "m", "n", "p", "r", "s", "t", "v", "w", "st", "tr", "ch", "th")
_NUCLEI = ("a", "e", "i", "o", "u", "ou", "ea", "ai")
_CODAS = ("", "", "n", "r", "s", "t", "l", "nd", "ng", "ck")


def vocabulary(size: int = 600, seed: int = 0) -> list[str]:
    """``size`` distinct lower-case words, the same for the same arguments."""
    rng = random.Random(seed)
    words: list[str] = []
    seen: set[str] = set()
    while len(words) < size:
        word = "".join(rng.choice(_ONSETS) + rng.choice(_NUCLEI) + rng.choice(_CODAS)
                       for _ in range(rng.choice((1, 1, 2, 2, 3))))
        if word not in seen:
            seen.add(word)
            words.append(word)
    return words


def sentences(count: int, *, seed: int = 0, vocab_size: int = 600, low: int = 4, high: int = 16) -> list[str]:
    """``count`` sentences of ``low`` to ``high`` words each, drawn from ``vocabulary(vocab_size)``."""
    rng = random.Random(seed + 1)
    words = vocabulary(vocab_size)
    weights = [1.0 / (rank + 1) for rank in range(len(words))]
    out = []
    for _ in range(count):
        chosen = rng.choices(words, weights=weights, k=rng.randint(low, high))
        out.append(" ".join(chosen).capitalize() + ".")
    return out
