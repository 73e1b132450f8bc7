"""The extractive summary: the same seven sections as the LLM's, written without an LLM.

The deterministic fallback when the LLM fails or none is configured: lines taken verbatim
from the span, the least important dropped first when the budget is tight.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Final

from compaction_worker.contracts.events import LlmUsage
from compaction_worker.contracts.toolpairs import pair_results
from compaction_worker.summaries.artifacts import extract_artifacts
from compaction_worker.summaries.contract import (
    CountTokens,
    SummarizerError,
    SummaryRequest,
    SummaryResult,
    validate_summary,
)
from compaction_worker.summaries.instructions import Terms, instruction_terms, matches
from compaction_worker.summaries.prompts import SECTIONS, render_content
from compaction_worker.summaries.sentences import asking, asks_for_work, says_nothing_new

_SENTENCE_END: Final = re.compile(r"(?<=[.!?])\s+")
_DECISION: Final = re.compile(
    r"\b(?:decided?|decision|chose|choose|chosen|will|plan(?:ned|s)?|because|instead|going to"
    r"|let's|opt(?:ed)?|prefer(?:red)?|so that)\b",
    re.IGNORECASE,
)
_MAX_SCAN_CHARS: Final = 20_000  # sentences are taken from the start of long texts only


def _prose(text: str) -> str:
    """Text without fenced code blocks, whitespace collapsed."""
    kept: list[str] = []
    in_code = False
    for line in text[:_MAX_SCAN_CHARS].splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        elif not in_code:
            kept.append(line)
    return " ".join(" ".join(kept).split())


def _sentences(text: str) -> list[str]:
    return [s for s in _SENTENCE_END.split(_prose(text)) if s]


def _lead(text: str, max_words: int = 30, min_words: int = 6) -> str:
    """The first sentences of a text, at least ``min_words`` words, cut at ``max_words``."""
    words: list[str] = []
    for sentence in _sentences(text):
        words += sentence.split()
        if len(words) >= min_words:
            break
    return _words(" ".join(words or text.split()), max_words)  # all code: its first words then


def _words(text: str, max_words: int) -> str:
    words = text.split()
    return " ".join(words[:max_words]) + (" ..." if len(words) > max_words else "")


@dataclass(frozen=True, slots=True)
class _Line:
    section: str
    text: str
    priority: int
    """Lower is kept first when the budget is tight."""
    order: int
    """Position within its section."""
    hits: int = 0
    """How many of the instructions' terms it holds: the more, the earlier it is kept."""


class ExtractiveSummarizer:
    """A deterministic summary without an LLM, under the same section headings.

    Goals from the user's messages, decisions from the assistant's, the span's artifacts
    (those the chunk's own ledger does not already keep), tool results, errors, the
    assistant's last state and the user's last request. When the budget is tight, the
    least important lines go first: earlier summaries, tool facts, decisions, artifacts,
    then older goals; the latest request stays longest. With instructions, lines of the span
    that share their terms join in, and the lines sharing the most are kept first.
    """

    name = "extractive"

    def __init__(self, count_tokens: CountTokens) -> None:
        self._count = count_tokens

    def __repr__(self) -> str:
        return "<ExtractiveSummarizer>"

    async def summarize(self, request: SummaryRequest) -> SummaryResult:
        """Summarize without an LLM; raises SummarizerError only when nothing valid fits."""
        text = self.render(request)
        tokens = self._count(text)
        validate_summary(text, tokens, request)
        return SummaryResult(text, self.name, tokens, LlmUsage())

    def render(self, request: SummaryRequest) -> str:
        """The summary text, within the request's token budget."""
        budget = request.max_summary_tokens
        if request.replaced_tokens > 0:
            budget = min(budget, request.replaced_tokens - 1)
        terms = instruction_terms(request.instructions)
        lines = list(self._lines(request, budget))
        if terms:
            lines += _asked_lines(request.messages, terms)
            lines = [replace(ln, hits=matches(ln.text, terms)) for ln in lines]
        if not lines:
            raise SummarizerError("nothing to summarize: the span has no text")
        return self._fit(lines, budget)

    def _lines(self, request: SummaryRequest, budget: int) -> Iterator[_Line]:
        messages = request.messages
        # Acknowledgments and remarks that state nothing needed are no request, state or goal (unless
        # the span says nothing else).
        users = _saying(messages, "user")
        assistants = _saying(messages, "assistant")
        if users:
            # The latest message that asks for something is the request; a remark is none, and the
            # span's last one ranks with the older goals.
            latest = next((m for m in reversed(users) if asks_for_work(_text(m))), None)
            if latest is not None:
                # What it asks, not the remarks around it.
                asked = _words(" ".join(asking(_text(latest))), 40)
                yield _Line("Next steps", f"- User's latest request: {asked}", 0, 0)
            else:
                yield _Line("Current state", f"- User's last message: {_lead(_text(users[-1]), 40)}", 5, 1)
        if assistants:
            yield _Line(
                "Current state",
                f"- Assistant's last message: {_lead(_text(assistants[-1]), 40)}",
                1,
                0,
            )
        goals = list(dict.fromkeys(_lead(_text(m)) for m in users[:-1] or users))
        for i, goal in enumerate(goals):
            yield _Line("Goals and constraints", f"- User: {goal}", 2 if i == 0 else 5, i)
        # Items the chunk's own ledger keeps verbatim need no line here: the room goes to others.
        ledger = extract_artifacts(messages, max(1, budget // 2), self._count, exclude=request.ledger)
        for i, item in enumerate(ledger):
            section = "Errors" if item.startswith("error: ") else "Artifacts and paths"
            yield _Line(section, f"- {item}", 3 if section == "Errors" else 4, i)
        decisions = [s for m in assistants for s in _sentences(_text(m)) if _DECISION.search(s)]
        for i, sentence in enumerate(dict.fromkeys(decisions)):
            yield _Line("Decisions and reasons", f"- Assistant: {_words(sentence, 30)}", 6, i)
        for i, fact in enumerate(dict.fromkeys(_tool_facts(messages))):
            yield _Line("Facts learned from tools", f"- {fact}", 7, i)
        # Earlier summaries are older than anything in the span: listed first in a section.
        for i, summary in enumerate(request.previous_summaries):
            for j, (section, line) in enumerate(_summary_lines(summary)):
                yield _Line(section, line, 8, -1_000_000_000 + i * 1_000_000 + j)

    def _fit(self, lines: list[_Line], budget: int) -> str:
        """Headings and the most important lines that fit; a single heading if seven do not."""
        headings: Sequence[str] = SECTIONS
        if self._count(_compose(headings, [min(lines, key=_rank)])) > budget:
            headings = ("Summary",)
            ranked = sorted(lines, key=_rank)
            lines = [_Line("Summary", ln.text, ln.priority, i, ln.hits) for i, ln in enumerate(ranked)]
        chosen: list[_Line] = []
        used = self._count(_compose(headings, []))
        for line in sorted(lines, key=_rank):
            cost = self._count(line.text) + 1
            if used + cost <= budget:
                chosen.append(line)
                used += cost
        # Token counts do not add up exactly; the composed text is what must fit.
        while chosen and self._count(_compose(headings, chosen)) > budget:
            chosen.remove(max(chosen, key=_rank))
        if not chosen:
            chosen = [self._shortened(min(lines, key=_rank), headings, budget)]
        return _compose(headings, chosen)

    def _shortened(self, line: _Line, headings: Sequence[str], budget: int) -> _Line:
        """The most important line, cut to as many words as fit (binary search)."""
        words = line.text.split()
        low, high = 0, len(words)  # words[:low] fits; words[:high + 1] does not
        while low < high:
            mid = (low + high + 1) // 2
            candidate = replace(line, text=" ".join(words[:mid]) + " ...")
            if self._count(_compose(headings, [candidate])) <= budget:
                low = mid
            else:
                high = mid - 1
        if low < 2:
            raise SummarizerError(f"a budget of {budget} tokens fits no summary")
        return replace(line, text=" ".join(words[:low]) + " ...")


def _rank(line: _Line) -> tuple[int, int, int]:
    # What the instructions name first; within a priority, later lines first: the most
    # recent goals, errors and facts matter most.
    return -line.hits, line.priority, -line.order


_ASKED_SECTIONS: Final = {
    "user": ("Goals and constraints", "User"),
    "assistant": ("Decisions and reasons", "Assistant"),
    "tool": ("Facts learned from tools", "Tool"),
}
_ASKED_ORDER: Final = 1_000_000
"""Lines found for the instructions follow a section's own lines (ordered by position)."""


def _asked_lines(messages: Sequence[Mapping[str, Any]], terms: Terms) -> Iterator[_Line]:
    """Each line of the span that shares a term with the instructions, once, under its speaker's section."""
    seen: set[str] = set()
    for index, message in enumerate(messages):
        placed = _ASKED_SECTIONS.get(str(message.get("role")))
        if placed is None:
            continue
        section, who = placed
        for j, raw in enumerate(_text(message)[:_MAX_SCAN_CHARS].splitlines()):
            line = _words(raw.strip(), 30)
            if line and line not in seen and matches(line, terms):
                seen.add(line)
                yield _Line(section, f"- {who}: {line}", 2, _ASKED_ORDER + index * 10_000 + j)


def _saying(messages: Sequence[Mapping[str, Any]], role: str) -> list[Mapping[str, Any]]:
    """The messages of ``role`` with text, those that say something first: all of them if none does."""
    texts = [(m, render_content(m.get("content")).strip()) for m in messages if m.get("role") == role]
    with_text = [(m, text) for m, text in texts if text]
    return [m for m, text in with_text if not says_nothing_new(text)] or [m for m, _ in with_text]


def _compose(headings: Sequence[str], lines: Sequence[_Line]) -> str:
    parts: list[str] = []
    for heading in headings:
        under = [ln.text for ln in sorted(lines, key=lambda ln: ln.order) if ln.section == heading]
        # A section with nothing in it says nothing; a lone heading nothing the chunk's own does not.
        if under and len(headings) > 1:
            parts.append(f"## {heading}")
        parts += under
    return "\n".join(parts)


def _text(message: Mapping[str, Any]) -> str:
    return render_content(message.get("content"))


def _tool_facts(messages: Sequence[Mapping[str, Any]]) -> Iterator[str]:
    # By position: an id reused across turns names a different call each time.
    calls = pair_results(messages)
    for index, message in enumerate(messages):
        if message.get("role") == "tool":
            # A shell echo ("$ make test") repeats the command, which the artifacts list; a
            # command's outcome is usually its last line ("1 failed", "exit code 2").
            lines = [ln.strip() for ln in _text(message).splitlines() if ln.strip()]
            lines = [ln for ln in lines if not ln.startswith("$ ")] or lines
            if lines:
                call = calls.get(index)
                name = message.get("name") or (call.name if call and call.name else "tool")
                last = f" … {_words(lines[-1], 12)}" if len(lines) > 1 else ""
                yield f"{name}: {_words(lines[0], 25)}{last}"


def _summary_lines(summary: str) -> Iterator[tuple[str, str]]:
    """An earlier summary's lines, each under our section of the same heading (or Current state)."""
    known = {s.lower(): s for s in SECTIONS}
    section = "Current state"
    for raw in summary.splitlines():
        line = raw.strip()
        if line.startswith("#"):
            section = known.get(line.lstrip("#").strip().lower(), "Current state")
        elif line and line.lower() not in ("- none", "none"):
            yield section, line if line.startswith("- ") else f"- {line}"
