"""What a user could pick instead of the product to carry a short session under a budget.

Each carrier takes what it carried last round plus the turns added since, and returns the
messages it would send, at or under ``budget`` tokens (``counter.messages``). They are written
plainly, the way a user would in a few lines, and they know nothing of the product's extractor:

- ``checklist``: every user sentence that looks like an instruction or a fact (has a digit, a
  name mid-sentence, or an instruction word) becomes a "- " line, newest last; over budget, the
  oldest lines go.
- ``checklist+updates``: the same, but a sentence sharing most of its content words with an
  earlier line replaces it.
- ``summary+tail``: the extractive summarizer's summary of the older messages, then the newest
  messages verbatim, each in about half the budget.
- ``sliding window``: the newest messages that fit.

The product itself (``compaction-worker``) is driven through ``strategies.compact`` by
``bench/short_standing.py``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

from compaction_worker.contracts.history import text_of
from compaction_worker.summaries.contract import SummarizerError, SummaryRequest
from compaction_worker.summaries.extractive import ExtractiveSummarizer

Message = Mapping[str, Any]


class Counter(Protocol):
    def message(self, message: Mapping[str, Any]) -> int: ...

    def text(self, text: str) -> int: ...


class Carrier(Protocol):
    name: str

    def carry(self, carried: Sequence[Message], added: Sequence[Message], budget: int) -> list[Message]:
        """What to send next: ``carried`` (the last round's output) and ``added``, within ``budget``."""
        ...


# --- checklists ----------------------------------------------------------------------------------

_INSTRUCTION = re.compile(
    r"\b(must|never|always|don'?t|do not|only|keep|use|prefer|please|should|need|rule|constraint|"
    r"goal|status|limit|max|at most|at least|deadline)\b",
    re.IGNORECASE,
)
_NAME_INSIDE = re.compile(r"\s[A-Z][a-z]+")
_SPLIT = re.compile(r"(?<=[.!?])\s+")
_STOP_WORDS = """the a an and or but of to in on at for with by from as is are was were be been it its this
    that these those we you i our your my me us they them their there here not no do does did can
    can't will would should must may might have has had get gets got make made let let's please
    actually instead now then just also so very too all any each per more most less least after
    before over under up down out into about than what when where which who how new old only keep
    use that's what's"""
_STOP = frozenset(_STOP_WORDS.split())


def _sentences(messages: Sequence[Message]) -> list[str]:
    """The sentences of the user's messages, in order (a checklist's own "- " lines included)."""
    out: list[str] = []
    for message in messages:
        if message.get("role") != "user":
            continue
        for line in text_of(message).splitlines():
            out += [s.strip() for s in _SPLIT.split(line.removeprefix("- ")) if s.strip()]
    return out


def looks_needed(sentence: str) -> bool:
    """An instruction or a fact, to the eye: not a question, and a digit, a name or an instruction word."""
    if sentence.endswith("?"):
        return False
    return any(c.isdigit() for c in sentence) or bool(
        _INSTRUCTION.search(sentence) or _NAME_INSIDE.search(sentence)
    )


def content_words(sentence: str) -> set[str]:
    """Lower-case words of three letters or more, values (digits, names, paths) and filler words left out."""
    words = [w.strip(",.;:!?()\"'") for w in sentence.split()]
    return {
        w.lower()
        for i, w in enumerate(words)
        if w.isalpha() and len(w) >= 3 and (i == 0 or w[0].islower()) and w.lower() not in _STOP
    }


class Checklist:
    """Instruction- and fact-like user sentences as "- " lines, newest last; the oldest go first."""

    def __init__(self, counter: Counter, *, updates: bool = False) -> None:
        self.counter, self.updates = counter, updates
        self.name = "checklist+updates" if updates else "checklist"

    def carry(self, carried: Sequence[Message], added: Sequence[Message], budget: int) -> list[Message]:
        lines: list[str] = []
        for sentence in _sentences([*carried, *added]):
            if not looks_needed(sentence):
                continue
            lines = [line for line in lines if line != sentence and not self._replaces(sentence, line)]
            lines.append(sentence)
        while lines and self.counter.message(_list(lines)) > budget:
            lines.pop(0)
        return [_list(lines)] if lines else []

    def _replaces(self, later: str, earlier: str) -> bool:
        if not self.updates:
            return False
        new, old = content_words(later), content_words(earlier)
        shared = len(new & old)
        return shared > 0 and 2 * shared > min(len(new), len(old))


def _list(lines: Sequence[str]) -> dict[str, Any]:
    return {"role": "user", "content": "\n".join(f"- {line}" for line in lines)}


# --- the newest messages, with or without a summary before them ----------------------------------


class SlidingWindow:
    """The newest messages that fit."""

    name = "sliding window"

    def __init__(self, counter: Counter) -> None:
        self.counter = counter

    def carry(self, carried: Sequence[Message], added: Sequence[Message], budget: int) -> list[Message]:
        return newest(self.counter, [*carried, *added], budget)


def newest(counter: Counter, messages: Sequence[Message], room: int) -> list[Message]:
    """The newest messages whose tokens add up to at most ``room``, not starting with a tool result."""
    kept: list[Message] = []
    used = 0
    for message in reversed(messages):
        cost = counter.message(message)
        if used + cost > room:
            break
        kept.insert(0, message)
        used += cost
    while kept and kept[0].get("role") == "tool":
        kept.pop(0)
    return kept


SUMMARY_HEADER = "Summary of the earlier conversation:"


class SummaryTail:
    """The extractive summary of what is older than the tail, then the tail verbatim (half the budget each)."""

    name = "summary+tail"

    def __init__(self, counter: Counter) -> None:
        self.counter = counter
        self.summarizer = ExtractiveSummarizer(counter.text)

    def carry(self, carried: Sequence[Message], added: Sequence[Message], budget: int) -> list[Message]:
        messages = [*carried, *added]
        tail = newest(self.counter, messages, budget // 2)
        older = messages[: len(messages) - len(tail)]
        earlier = [text_of(m).removeprefix(SUMMARY_HEADER).strip() for m in older if _is_summary(m)]
        span = [m for m in older if not _is_summary(m)]
        room = budget - sum(self.counter.message(m) for m in tail)
        if not span:  # nothing new to summarize: the earlier summary stays as it was, if it fits
            kept = [m for m in older if _is_summary(m) and self.counter.message(m) <= room]
            return [*kept[-1:], *tail]
        summary = self._summary(span, earlier, room)
        return [summary, *tail] if summary else tail

    def _summary(self, span: Sequence[Message], earlier: Sequence[str], room: int) -> dict[str, Any] | None:
        ask = room - self.counter.message({"role": "user", "content": SUMMARY_HEADER + "\n"})
        while ask > 0:
            request = SummaryRequest("bench", span, previous_summaries=earlier, max_summary_tokens=ask)
            try:
                text = self.summarizer.render(request)
            except SummarizerError:
                return None
            message = {"role": "user", "content": f"{SUMMARY_HEADER}\n{text}"}
            over = self.counter.message(message) - room
            if over <= 0:
                return message
            ask -= over
        return None


def _is_summary(message: Message) -> bool:
    return message.get("role") == "user" and text_of(message).startswith(SUMMARY_HEADER)
