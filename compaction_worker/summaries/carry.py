"""What a text says that common words do not: its distinctive terms, found without a list of kinds.

A term is distinctive by its shape, not by a pattern per kind: a digit inside (``v2``,
``3.11``, ``8080``), inner punctuation (``fields.py``, ``a/b``, ``KEY=value``, ``x@y.io``,
``snake_case``, ``kebab-case``), an inner capital (``TimeDelta``, ``camelCase``,
``HTTP``), or code and quote marks around it. :func:`carry` keeps those of a text that is
cut, each with the few words around it, within a token budget; what does not fit is
returned too, so that the loss can be counted.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Final

__all__ = ["Carried", "carry", "distinctive_terms", "is_distinctive"]

# A word: what lies between spaces, less the punctuation that only surrounds it.
_WORD: Final = re.compile(r"\S+")
_EDGES: Final = "()[]{}<>,;:!?\"'`.*\u201c\u201d\u2018\u2019"
_CODE: Final = re.compile(r"`([^`\n]{1,120})`|\"([^\"\n]{2,80})\"")
_INNER_PUNCT: Final = re.compile(r"[A-Za-z0-9][/.:=@_\-\\#~+][A-Za-z0-9]")
_INNER_CAPITAL: Final = re.compile(r"[a-z][A-Z]|[A-Z]{2,}")
MAX_TERM_CHARS: Final = 120
"""A longer run without spaces (a blob, a minified line) is not a term anyone restates."""
CONTEXT_WORDS: Final = 3
"""Words kept on each side of a carried term."""


def is_distinctive(word: str) -> bool:
    """Whether a word (its surrounding punctuation stripped) is unlike a common word."""
    if len(word) < 2 or len(word) > MAX_TERM_CHARS:
        return False
    return (
        any(c.isdigit() for c in word)
        or _INNER_PUNCT.search(word) is not None
        or _INNER_CAPITAL.search(word) is not None
    )


def _strip(word: str) -> str:
    return word.strip(_EDGES)


def distinctive_terms(text: str) -> list[str]:
    """The text's distinctive terms, each once, in order of first appearance."""
    found: dict[str, None] = {}
    for match in _CODE.finditer(text):
        span = (match.group(1) or match.group(2) or "").strip()
        if span and len(span) <= MAX_TERM_CHARS and (" " not in span or match.group(1)):
            found.setdefault(span)
    for match in _WORD.finditer(text):
        word = _strip(match.group())
        if is_distinctive(word):
            found.setdefault(word)
    return list(found)


@dataclass(frozen=True, slots=True)
class Carried:
    """What :func:`carry` kept of a text: phrases with their terms, and the terms left out."""

    phrases: tuple[str, ...]
    carried: tuple[str, ...]
    dropped: tuple[str, ...]


def carry(text: str, budget: int, count: Callable[[str], int], *, skip: Iterable[str] = ()) -> Carried:
    """The distinctive terms of ``text`` with ``CONTEXT_WORDS`` words around each, within ``budget`` tokens.

    Terms already in ``skip`` (said elsewhere, verbatim) are not repeated. A phrase that
    covers several terms carries them all; phrases go in order of appearance until the
    budget is spent, and every term left is in ``dropped``.
    """
    said = set(skip)
    terms = [t for t in distinctive_terms(text) if t not in said]
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    ends = [end for _, end in words]
    phrases: list[str] = []
    carried: list[str] = []
    dropped: list[str] = []
    spent = 0
    covered: set[str] = set()
    for term in terms:
        if term in covered:
            continue
        phrase = _phrase(text, words, ends, term)
        inside = [t for t in terms if t not in covered and t in phrase]
        cost = count(phrase) + 1
        if spent + cost > budget:
            dropped.append(term)
            continue
        spent += cost
        phrases.append(phrase)
        covered.update(inside)
        carried.extend(inside)
    dropped = [t for t in dropped if t not in covered]
    return Carried(tuple(phrases), tuple(dict.fromkeys(carried)), tuple(dict.fromkeys(dropped)))


def _phrase(text: str, words: list[tuple[int, int]], ends: list[int], term: str) -> str:
    """The term with up to ``CONTEXT_WORDS`` words on each side, from its first appearance."""
    at = text.find(term)
    if at < 0 or not words:
        return term
    first = min(bisect.bisect_right(ends, at), len(words) - 1)
    last = min(max(first, bisect.bisect_left(ends, at + len(term))), len(words) - 1)
    low = max(0, first - CONTEXT_WORDS)
    high = min(len(words) - 1, last + CONTEXT_WORDS)
    return " ".join(text[words[low][0] : words[high][1]].split())
