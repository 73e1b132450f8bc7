"""What :class:`~compaction_worker.testing.FakeLLMServer` answers: summaries and providers' errors.

:func:`default_summary` is a deterministic stand-in for an LLM's summary of a
chat-completions request; :func:`provider_overflow_error` is the context-overflow error
each provider really sends, for testing reactive compaction.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Sequence
from functools import cache
from typing import Any

from compaction_worker.budget.tokens import TokenCounter, counter_for
from compaction_worker.contracts.history import text_of
from compaction_worker.settings import BudgetSettings

__all__ = [
    "OVERFLOW_PROVIDERS",
    "asks_for_json",
    "default_summary",
    "provider_overflow_error",
    "schema_reply",
    "schema_summary",
]

# --- provider errors -----------------------------------------------------------------


def _openai_overflow(actual: int, maximum: int) -> tuple[int, dict[str, Any]]:
    return 400, {
        "error": {
            "message": (
                f"This model's maximum context length is {maximum} tokens. However, your "
                f"messages resulted in {actual} tokens. Please reduce the length of the messages."
            ),
            "type": "invalid_request_error",
            "param": "messages",
            "code": "context_length_exceeded",
        }
    }


def _anthropic_overflow(actual: int, maximum: int) -> tuple[int, dict[str, Any]]:
    return 400, {
        "type": "error",
        "error": {
            "type": "invalid_request_error",
            "message": f"prompt is too long: {actual} tokens > {maximum} maximum",
        },
    }


def _gemini_overflow(actual: int, maximum: int) -> tuple[int, dict[str, Any]]:
    return 400, {
        "error": {
            "code": 400,
            "message": (
                f"The input token count ({actual}) exceeds the maximum number of tokens allowed ({maximum})."
            ),
            "status": "INVALID_ARGUMENT",
        }
    }


OVERFLOW_PROVIDERS: dict[str, Callable[[int, int], tuple[int, dict[str, Any]]]] = {
    "openai": _openai_overflow,
    "azure": _openai_overflow,  # Azure OpenAI sends OpenAI's body unchanged
    "anthropic": _anthropic_overflow,
    "gemini": _gemini_overflow,
}
"""Context-overflow errors as each provider sends them: ``(actual, maximum) -> (status, body)``."""


def provider_overflow_error(
    provider: str = "openai", actual: int = 9000, maximum: int = 8192
) -> tuple[int, dict[str, Any]]:
    """Return the HTTP status and JSON body of ``provider``'s context-overflow error."""
    try:
        build = OVERFLOW_PROVIDERS[provider]
    except KeyError:
        known = ", ".join(sorted(OVERFLOW_PROVIDERS))
        raise ValueError(f"unknown provider {provider!r}; known: {known}") from None
    return build(actual, maximum)


# --- the default reply ---------------------------------------------------------------

_SNIPPET_WORDS = 12
_MIN_SNIPPET_WORDS = 4
_MIN_BUDGET_WORDS = 32
_SUMMARY_WORDS = 300
_ROLE_HEADER = re.compile(
    r"^[\s\-*#>\[(<\d.:]*(?:message\s+role\s*=\s*[\"']?)?\**"
    r"(?P<role>system|user|assistant|tool|function)\b"
    r"(?:[^\n:]{0,40}?[:\]>)]+|\s*$)[ \t]*",
    re.IGNORECASE,
)
_FENCED_TAG = re.compile(r"<(?P<tag>[A-Za-z_][\w-]*)[^>]*>(?P<body>.*?)</(?P=tag)>", re.DOTALL)
_FENCED_TICKS = re.compile(r"```[^\n]*\n(?P<body>.*?)```", re.DOTALL)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s")


def _transcript_of(body: dict[str, Any]) -> str:
    """The transcript a summarizer sent: the last user message, inside its fence if it has one."""
    messages = body.get("messages") or []
    text = next(
        (text_of(m) for m in reversed(messages) if isinstance(m, dict) and m.get("role") == "user"),
        "",
    )
    # Summarizers fence the transcript as untrusted data; the instructions around it are
    # not part of what is summarized.
    # This product's own requests name it: the memory's current items, listed beside it, can be longer.
    tags = {m.group("tag"): m.group("body") for m in _FENCED_TAG.finditer(text)}
    if "transcript" in tags:
        return tags["transcript"]
    fenced = [*tags.values(), *(m.group("body") for m in _FENCED_TICKS.finditer(text))]
    return max(fenced, key=len) if fenced else text


def _entries(transcript: str) -> list[tuple[str | None, str]]:
    """Split a transcript into ``(role, text)`` entries by JSON, role headers or paragraphs."""
    stripped = transcript.strip()
    if stripped.startswith("["):
        try:
            data = json.loads(stripped)
        except ValueError:
            data = None
        if isinstance(data, list) and all(isinstance(m, dict) for m in data):
            return [(m.get("role"), text_of(m)) for m in data]
    entries: list[tuple[str | None, str]] = []
    role: str | None = None
    lines: list[str] = []
    found_header = False
    for line in stripped.splitlines():
        header = _ROLE_HEADER.match(line)
        if header:
            if found_header or any(s.strip() for s in lines):
                entries.append((role, "\n".join(lines)))
            found_header = True
            role, lines = header.group("role").lower(), [line[header.end() :]]
        else:
            lines.append(line)
    entries.append((role, "\n".join(lines)))
    if not found_header:
        paragraphs = [p for p in re.split(r"\n\s*\n", stripped) if p.strip()]
        if len(paragraphs) <= 1:
            paragraphs = stripped.splitlines()
        entries = [(None, p) for p in paragraphs]
    return [(r, t) for r, t in entries if t.strip()]


def _snippet(text: str) -> str:
    """The first sentence of ``text`` (longer if that is under 4 words), at most 12 words."""
    words: list[str] = []
    for sentence in _SENTENCE_END.split(" ".join(text.split())):
        words += sentence.split()
        if len(words) >= _MIN_SNIPPET_WORDS:
            break
    if len(words) > _SNIPPET_WORDS:
        return " ".join(words[:_SNIPPET_WORDS]) + " ..."
    return " ".join(words)


def _bullet(role: str | None, text: str) -> str:
    return f"- {role}: {_snippet(text)}" if role else f"- {_snippet(text)}"


def default_summary(body: dict[str, Any]) -> str:
    """The fake's deterministic summary of a chat-completions request body (:func:`schema_summary`
    when the request asks for JSON).

    One bullet (first sentence, at most 12 words) per message found in the transcript,
    under the headings a real summary has; at most ~300 words and at most half the
    transcript's words (but 32 at least), so a summary of any transcript worth
    compacting is clearly shorter than what it covers; and within the request's
    ``max_tokens``, as a model asked for that many writes to fit them.
    """
    if asks_for_json(body):
        return schema_summary(body)
    transcript = _transcript_of(body)
    entries = _entries(transcript)
    if not entries:
        return "## Current state\n- (empty transcript)"
    budget = min(_SUMMARY_WORDS, max(_MIN_BUDGET_WORDS, len(transcript.split()) // 2))
    headings = ["## Goals and constraints", "## Current state", "## Next steps"]
    # A model asked for at most max_tokens writes to fit them, as the prompt asks; a word of
    # these bullets (paths, code) is up to ~3 tokens, and the headings and a closing
    # "- ... and N more messages" line take their share too.
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    if isinstance(max_tokens, int) and max_tokens > 0:
        framing = sum(len(h.split()) for h in headings) + 6
        budget = min(budget, max(8, max_tokens // 3 - framing))
    goal_index = next((i for i, (role, _) in enumerate(entries) if role == "user"), 0)
    last_index = len(entries) - 1
    goal = _bullet(*entries[goal_index])
    nxt = f"- Continue from: {_snippet(entries[last_index][1])}" if last_index != goal_index else ""
    used = len(goal.split()) + len(nxt.split())
    state: list[str] = []
    middle = [e for i, e in enumerate(entries) if i not in (goal_index, last_index)]
    for n, entry in enumerate(middle):
        bullet = _bullet(*entry)
        if used + len(bullet.split()) > budget:
            state.append(f"- ... and {len(middle) - n} more messages")
            break
        state.append(bullet)
        used += len(bullet.split())
    parts = [headings[0], goal, headings[1]]
    parts += state or ["- (see next steps)"]
    if nxt:
        parts += [headings[2], nxt]
    if isinstance(max_tokens, int) and max_tokens > 0:
        parts = _within(parts, max(8, max_tokens // 3))  # a small budget cuts even the goal short
        # Words of paths and code can take four tokens each: cut further until the reply fits in
        # its tokens, as a model's does (with room for the product's count of another tokenizer).
        words = sum(len(line.split()) for line in parts)
        while words > 8 and _o200k().text("\n".join(parts)) > max_tokens * _FIT:
            words = max(8, words * 9 // 10)
            parts = _within(parts, words)
    return "\n".join(parts)


_FIT = 0.8
"""The share of ``max_tokens`` the reply keeps within, by o200k's count: a conversation's own
counter (another model's tokenizer, its multiplier) may count the same text up to a quarter higher."""


@cache
def _o200k() -> TokenCounter:
    """An OpenAI model's counter (o200k), made once."""
    return counter_for("gpt-4o", BudgetSettings())


def _within(lines: list[str], words: int) -> list[str]:
    """The lines, cut to at most ``words`` words in all (a line cut short keeps its first words)."""
    kept, used = [], 0
    for line in lines:
        parts = line.split()
        if used + len(parts) > words:
            if words - used > 1:
                kept.append(" ".join(parts[: words - used]))
            break
        kept.append(line)
        used += len(parts)
    return kept


# --- replies against the summary schema ----------------------------------------------------

_BLOCK = re.compile(r"^\[(?P<n>\d+)\] (?P<role>system|user|assistant|tool)\b[^\n]*:$", re.MULTILINE)
_PER_SECTION = re.compile(r"At most (\d+) items a list")
_MAX_CHARS = re.compile(r"at most (\d+) characters")


def asks_for_json(body: dict[str, Any]) -> bool:
    """Whether a request asks for the summary schema: ``response_format``, or a prompt that asks for JSON."""
    if body.get("response_format"):
        return True
    system = next((text_of(m) for m in body.get("messages") or [] if m.get("role") == "system"), "")
    return "Reply with one JSON object" in system


def blocks_of(body: dict[str, Any]) -> list[tuple[int, str, str]]:
    """The numbered transcript blocks a summary request carries: ``(n, role, text)``."""
    transcript = _transcript_of(body)
    found = list(_BLOCK.finditer(transcript))
    out = []
    for i, match in enumerate(found):
        end = found[i + 1].start() if i + 1 < len(found) else len(transcript)
        out.append((int(match.group("n")), match.group("role"), transcript[match.end() : end].strip()))
    return out


def schema_reply(sections: dict[str, list[tuple[str, list[int]]]], resolved: Sequence[str] = ()) -> str:
    """A reply against the summary schema: ``{"goals": [("text", [turns]), ...], ...}``."""
    data: dict[str, Any] = {
        key: [{"text": text, "turns": turns} for text, turns in sections.get(key, [])]
        for key in ("goals", "decisions", "artifacts", "facts", "errors", "state", "next")
    }
    data["resolved"] = list(resolved)
    return json.dumps(data)


def schema_summary(body: dict[str, Any]) -> str:
    """The fake's deterministic reply against the summary schema: the first user block as a goal, the
    last as the next step, the others' first sentences as the current state, each citing its block,
    within the counts, lengths and ``max_tokens`` the request sets."""
    blocks = [b for b in blocks_of(body) if b[2]]
    system = next((text_of(m) for m in body.get("messages") or [] if m.get("role") == "system"), "")
    per = int(m.group(1)) if (m := _PER_SECTION.search(system)) else 4
    chars = int(m.group(1)) if (m := _MAX_CHARS.search(system)) else 140
    if not blocks:
        return schema_reply({})
    first = next((b for b in blocks if b[1] == "user"), blocks[0])
    last = blocks[-1]
    middle = [b for b in blocks if b is not first and b is not last]

    def item(block: tuple[int, str, str]) -> tuple[str, list[int]]:
        return f"{block[1]}: {_snippet(block[2])}"[:chars], [block[0]]

    sections: dict[str, list[tuple[str, list[int]]]] = {"goals": [item(first)]}
    sections["state"] = [item(b) for b in middle[-per:]]
    if last is not first:
        sections["next"] = [item(last)]
    reply = schema_reply(sections)
    max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
    while isinstance(max_tokens, int) and sections["state"] and _o200k().text(reply) > max_tokens * _FIT:
        sections["state"] = sections["state"][1:]
        reply = schema_reply(sections)
    return reply
