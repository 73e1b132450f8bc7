"""What a text says that common words do not: its distinctive terms, found without a list of kinds.

A term is distinctive by its shape, not by a pattern per kind: a digit inside (``v2``,
``3.11``, ``8080``), inner punctuation (``fields.py``, ``a/b``, ``KEY=value``, ``x@y.io``,
``snake_case``, ``deployment/web``), an inner capital (``TimeDelta``, ``camelCase``,
``HTTP``), or code and quote marks around it. :func:`carry` keeps those of a text that is
cut, each with the few words around it, within a token budget; what does not fit is
returned too, so that the loss can be counted.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from compaction_worker.summaries.instructions import matches

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
DATA_LINE_WORDS: Final = 8
"""A line this long whose words are mostly distinctive is data (a log line, a table row), not prose."""


def is_distinctive(word: str) -> bool:
    """Whether a word (its surrounding punctuation stripped) is unlike a common word.

    English compounds of lowercase words (``well-known``, ``end-to-end``) and the common
    slash pairs (``and/or``) are common words joined, not terms; ``deployment/web`` is one,
    and a kebab-case name is the ``name`` kind's (``summaries.mentions``).
    """
    if len(word) < 2 or len(word) > MAX_TERM_CHARS or word in _COMMON_PAIRS:
        return False
    if any(c.isdigit() for c in word) or _INNER_CAPITAL.search(word) is not None:
        return True
    if _INNER_PUNCT.search(word) is None:
        return False
    # Lowercase words joined by hyphens: an English compound.
    return not (word.islower() and "/" not in word and word.replace("-", "").isalpha())


_COMMON_PAIRS: Final = frozenset(
    {
        *("and/or", "either/or", "he/she", "his/her", "him/her", "s/he", "yes/no", "on/off"),
        *("read/write", "true/false", "input/output", "client/server", "pros/cons", "w/o", "if/when"),
        *("e.g", "i.e", "a.m", "p.m"),
    }
)


_SENTENCE_END: Final = (".", "!", "?", ":", ";")
_BULLET: Final = re.compile(r"[-*+>\u2022]|#{1,6}|\d{1,3}[.)]|\(?[a-z]\)")
"""A list item's or a heading's marker: the word after it starts a sentence."""
_NOT_NAMES: Final = frozenset(
    {
        *("I", "I'm", "I've", "I'll", "I'd", "OK", "Ok", "Yes", "No", "Hi", "Hello", "Thanks", "Please"),
        *("The", "This", "That", "These", "Those", "It", "We", "You", "They", "He", "She", "If", "When"),
        *("Then", "But", "And", "Or", "So", "Also", "Now", "Here", "There", "What", "Why", "How"),
        *("Where", "Which", "Who"),
    }
)


def line_terms(line: str) -> Iterator[tuple[str, str]]:
    """``(term, phrase)`` for each distinctive term of a line of prose, the phrase its context.

    Besides :func:`is_distinctive` words, a capitalised word is a term (a person's, a
    company's, a weekday's, a technology's or a project's name), joined with the capitalised
    words right after it ("Alice Chen", "Project Nimbus"); at the start of a sentence only
    such a run of two or more counts, since every sentence starts with a capital.
    """
    words = line.split()
    # Most words are plain lowercase prose: one cheap test each, and each kind of word
    # classified once (words recur); the flags also tell a line of data from prose.
    kinds = [_PLAIN if w.isalpha() and w.islower() else _kind(w) for w in words]
    if len(words) >= DATA_LINE_WORDS and 2 * kinds.count(_TERM) > len(words):
        return  # mostly ids and numbers: a line of data, where nothing stands out
    i = 0
    while i < len(words):
        kind = kinds[i]
        last = i
        if kind == _TERM or (kind == _PLAIN and i > 0 and _names_next(words, i)):
            # A name given in lowercase ("the team is called bluefin") is one too.
            last = _joined(words, kinds, i)
        elif kind == _NAME:
            while last + 1 < len(words) and kinds[last + 1] == _NAME:
                if words[last].endswith((",", *_SENTENCE_END)):
                    break
                last += 1
            starts_sentence = (
                i == 0 or words[i - 1].endswith(_SENTENCE_END) or _BULLET.fullmatch(words[i - 1])
            )
            if starts_sentence and last == i:  # a sentence's first word: capitalised anyway
                i += 1
                continue
            last = _joined(words, kinds, last)
        else:
            i += 1
            continue
        term = _trimmed(" ".join([*words[i:last], words[last].rstrip(_EDGES)]))
        low = max(0, i - CONTEXT_WORDS)
        high = min(len(words) - 1, last + CONTEXT_WORDS)
        yield term, " ".join(words[low : high + 1])
        i = last + 1


_PLAIN, _TERM, _NAME = 0, 1, 2
_NAMING: Final = frozenset({"called", "named", "nicknamed", "codenamed", "dubbed", "titled"})


def _names_next(words: list[str], i: int) -> bool:
    """Whether the word before ``words[i]`` gives it as a name ("called X", "known as X")."""
    before = words[i - 1].lower()
    return before in _NAMING or (before == "as" and i > 1 and words[i - 2].lower() == "known")


def _joined(words: list[str], kinds: list[int], last: int) -> int:
    """The last word of the term ending at ``last`` once what belongs to it is joined: numbers and
    terms right after it ("0412 555 0199", "April 19", "Python 3.11") and a number's unit ("345 ms",
    "20 req/s", "80738 messages"), unless punctuation ends a word between them."""
    while last + 1 < len(words) and not words[last].endswith((",", *_SENTENCE_END)):
        following = words[last + 1]
        number = _NUMBER.fullmatch(words[last]) is not None
        if (number or kinds[last] == _NAME) and _NUMBER.fullmatch(following.rstrip(",.;:!?)")):
            last += 1
        elif number and _is_unit(following):
            return last + 1
        else:
            break
    return last


_NUMBER: Final = re.compile(r"[-+$€£]?\d[\d,]*(?:\.\d+)?")
_NOT_UNIT_WORDS: Final = "a an and at by for in is it of on or the to was we as if so"
_NOT_UNITS: Final = frozenset(_NOT_UNIT_WORDS.split())


def _is_unit(raw: str) -> bool:
    """Whether the word after a number reads as its unit: short, a rate or a share, or what it
    counts ("80738 messages", "12 retries")."""
    word = raw.rstrip(",.;:!?)")
    if "/" in word or word == "%":
        return 0 < len(word) <= 8
    if not word.isalpha() or word.lower() in _NOT_UNITS:
        return False
    return 0 < len(word) <= 4 or (word.islower() and word.endswith("s") and len(word) <= 14)


_COMPARISON: Final = re.compile(r"^(?:[<>!=~]=(?=[\w.])|[<>](?=\d))")


def _trimmed(term: str) -> str:
    """``term`` without the punctuation around it, but a comparison that opens it (">=5.0,<7.0" is a
    version range, not "=5.0,<7.0")."""
    opening = _COMPARISON.match(term)
    return term if opening else term.lstrip(_EDGES)


@functools.lru_cache(maxsize=1 << 15)
def _kind(raw: str) -> int:
    """Whether a word as written is plain, a distinctive term or a capitalised name."""
    word = raw.strip(_EDGES)
    if is_distinctive(word):
        return _TERM
    if word[:1].isupper() and word[1:].isalpha() and word[1:].islower() and word not in _NOT_NAMES:
        return _NAME
    return _PLAIN


def distinctive_terms(text: str) -> list[str]:
    """The text's distinctive terms (code spans, then each line's :func:`line_terms`), each once."""
    found: dict[str, None] = {}
    for match in _CODE.finditer(text):
        span = (match.group(1) or match.group(2) or "").strip()
        if span and len(span) <= MAX_TERM_CHARS and (" " not in span or match.group(1)):
            found.setdefault(span)
    for line in text.splitlines():
        for term, _ in line_terms(line):
            found.setdefault(term)
    return list(found)


@dataclass(frozen=True, slots=True)
class Carried:
    """What :func:`carry` kept of a text: phrases with their terms, and the terms left out."""

    phrases: tuple[str, ...]
    carried: tuple[str, ...]
    dropped: tuple[str, ...]


def carry(
    text: str,
    budget: int,
    count: Callable[[str], int],
    *,
    skip: Iterable[str] = (),
    prefer: frozenset[str] = frozenset(),
) -> Carried:
    """The distinctive terms of ``text`` with ``CONTEXT_WORDS`` words around each, within ``budget`` tokens.

    Terms already in ``skip`` (said elsewhere, verbatim) are not repeated. A phrase that
    covers several terms carries them all; phrases go in order of appearance until the
    budget is spent, those holding any of ``prefer`` (the compaction instructions' terms,
    ``summaries.instructions``) first, and every term left is in ``dropped``.
    """
    said = set(skip)
    terms = [t for t in distinctive_terms(text) if t not in said]
    words = [(m.start(), m.end()) for m in _WORD.finditer(text)]
    ends = [end for _, end in words]
    if prefer:  # a stable sort: in order of appearance otherwise
        terms.sort(key=lambda t: -matches(_phrase(text, words, ends, t), prefer))
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
