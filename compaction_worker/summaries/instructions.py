"""Compaction instructions: which apply to a run, and the terms that order what a summary keeps.

A runtime steers a compaction in words ("keep the migration plan and every failing test
name"): the LLM reads them (fenced, in :mod:`compaction_worker.summaries.prompts`); the
extractive summary and the ledgers cannot read, so they rank first what shares a term with
them. A term is a word of the instructions less the common ones, reduced to a crude stem,
so that "failing" finds "FAILED" and "tests" finds "test_login".
"""

from __future__ import annotations

import re
from collections.abc import Collection
from typing import Final

Terms = frozenset[str]

_WORD: Final = re.compile(r"[0-9A-Za-z_][\w./:@-]*")
_PARTS: Final = re.compile(r"[./:@_-]+")
_COMMON: Final = frozenset(
    (  # noqa: SIM905  # a word list reads as words, not as ninety quoted strings
        "a an and any all also are as at be but by can do does each every for from have how if in into is it "
        "its keep kept keeps let me must my not of on or our please make sure should so that the their them "
        "then there these this those to up us use we what when where which while who will with you your "
        "summary summaries summarize compaction compact retain preserve mention list include especially "
        "everything anything something only just more most less very about"
    ).split()
)


def applied_instructions(standing: str | None, request: str | None) -> str | None:
    """The instructions a run applies: the conversation's standing ones, then the request's; None if neither."""
    parts = [text.strip() for text in (standing, request) if text and text.strip()]
    return "\n\n".join(dict.fromkeys(parts)) or None


def _stem(word: str) -> str:
    """A crude English stem: plurals, ``-ed``, ``-ing`` and a final ``e`` go (``naming``, ``names`` -> ``nam``)."""
    if len(word) <= 3:
        return word
    if word.endswith("ies") and len(word) > 4:
        word = word[:-3] + "y"
    elif word.endswith(("sses", "xes", "zes", "ches", "shes")):
        word = word[:-2]
    elif word.endswith("s") and not word.endswith("ss"):
        word = word[:-1]
    for suffix in ("ing", "ed"):
        if word.endswith(suffix) and len(word) - len(suffix) >= 3:
            word = word[: -len(suffix)]
            if word[-1] == word[-2] and word[-1] not in "lsz":  # running -> run
                word = word[:-1]
            break
    return word[:-1] if word.endswith("e") and len(word) > 3 else word


def _words(text: str) -> set[str]:
    """The text's words, lowercased and stemmed, each also split at inner punctuation."""
    found: set[str] = set()
    for match in _WORD.finditer(text.lower()):
        word = match.group().rstrip(".:-/")
        found.add(_stem(word))
        found.update(_stem(part) for part in _PARTS.split(word) if part)
    return found


def instruction_terms(instructions: str | None) -> Terms:
    """The terms of ``instructions`` that a kept line or item should share (none without instructions)."""
    words = (match.group().rstrip(".:-/") for match in _WORD.finditer((instructions or "").lower()))
    return frozenset(_stem(word) for word in words if len(word) >= 3 and word not in _COMMON)


def matches(text: str, terms: Collection[str]) -> int:
    """How many of ``terms`` the text holds (0 without terms)."""
    if not terms:
        return 0
    return len(_words(text).intersection(terms))
