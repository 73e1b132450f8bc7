"""The effective history as plain data: summary chunks, then entries; and how it renders.

An entry is a transcript message as the model sees it (maybe edited) or a synthetic one
repair made up; a chunk covers a contiguous span of transcript messages by ordinal.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

SummaryPlacement = Literal["separate", "merge"]
"""Where the summary goes when rendering: its own user turn plus an acknowledgment, or
merged into the first kept user message (see :func:`render`)."""

SUMMARY_HEADER = "[Conversation summary]"
# Sent with every later request of the conversation: every token of them is paid again on each call.
# Each chunk's heading says which turns it stands for; the messages after the summary are verbatim.
SUMMARY_ACK = "Understood."

# Fields that are ours, not the provider's; stripped when rendering and not counted.
# ``native`` holds what a format adapter (compaction_worker.formats) could not map;
# ``working_state`` the structured state a restored-state message shows (``RESTORED``).
PRIVATE_FIELDS = ("pinned", "task", "native", "working_state", "standing_state")

SYNTHETIC = "synthetic"
"""The ``edit`` of an entry that repair made up (a placeholder tool call or result, a
separator turn). It stands for no transcript message, so its ordinal is 0."""

RESTORED = "restored"
"""The ``edit`` of the working state a compaction restored after its summary: the latest
files and plan the summarized span held (``strategies.working_state``). Like a synthetic
entry it has ordinal 0 and covers nothing; it renders inside the summary turn."""
RESTORED_HEADER = "[Restored working state]"

STANDING = "standing"
"""The ``edit`` of the standing state a compaction keeps: the rules, constraints, preferences, goals,
decisions and facts the user stated, verbatim (``strategies.standing_state``). Ordinal 0, covers
nothing, renders inside the summary turn before the restored working state."""


@dataclass(frozen=True, slots=True)
class Entry:
    """One message of the effective history, with where it came from and its token count."""

    n: int
    """Ordinal of the message in the transcript (1-based, over the whole conversation)."""
    seq: int
    """The ``turn_seq`` of the turn that added it."""
    message: Mapping[str, Any]
    tokens: int
    edit: str | None = None
    """A non-LLM edit applied to it (``pruned``, ``deduplicated``, ``truncated``), if any,
    or ``synthetic`` for a message repair made up (then ``n`` is 0)."""

    @property
    def role(self) -> str:
        return str(self.message["role"])

    @property
    def pinned(self) -> bool:
        """Never compacted: a message the runtime marked ``pinned``, or a system message.

        A system message is the runtime's instructions (its prompt sent as a message, or one
        added later): no stage summarizes, prunes, cuts or drops it.
        """
        return self.role == "system" or bool(self.message.get("pinned", False))

    @property
    def synthetic(self) -> bool:
        """Whether repair made this message up: it is no transcript message and covers none."""
        return self.edit == SYNTHETIC or self.n < 1

    def to_json(self) -> str:
        return json.dumps(
            {"n": self.n, "seq": self.seq, "m": self.message, "t": self.tokens, "e": self.edit},
            separators=(",", ":"),
            ensure_ascii=False,
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> Entry:
        data = json.loads(raw)
        return cls(n=data["n"], seq=data["seq"], message=data["m"], tokens=data["t"], edit=data.get("e"))


@dataclass(frozen=True, slots=True)
class SummaryChunk:
    """A summary that stands for transcript messages ``first_n..last_n`` (turns ``first_seq..last_seq``)."""

    id: str
    text: str
    first_seq: int
    last_seq: int
    first_n: int
    last_n: int
    tokens: int
    created_at: str
    model: str
    """The summarizer that wrote it (a LiteLLM model string, or ``extractive``)."""
    stages: tuple[str, ...] = ()
    level: int = 0
    """0 for a summary of messages; n > 0 for a fold of level n-1 chunks."""
    artifacts: tuple[str, ...] = field(default=())
    """Exact paths, commands, errors, URLs and ids from the span, kept verbatim."""
    kept: tuple[int, ...] = field(default=())
    """Ordinals inside ``first_n..last_n`` that are not covered: pinned messages kept as entries."""
    items: tuple[str, ...] = field(default=())
    """The summary as checked items (``summaries.schema.Item``, each encoded), when its summarizer wrote
    items: ``text`` renders them. An additive chunk holds the items it adds or changes; a fold, all."""

    def covers(self, n: int) -> bool:
        """Whether transcript message ``n`` is represented by this chunk.

        Ordinals start at 1; a synthetic entry (ordinal 0) is never covered, even by a
        chunk whose span a careless caller computed from it.
        """
        return n >= 1 and self.first_n <= n <= self.last_n and n not in self.kept

    def to_json(self) -> str:
        data = asdict(self)
        if not self.items:
            del data["items"]  # a chunk without items is stored as before they existed
        return json.dumps(data, separators=(",", ":"), ensure_ascii=False)

    @classmethod
    def from_json(cls, raw: str | bytes) -> SummaryChunk:
        data = json.loads(raw)
        for key in ("stages", "artifacts", "kept", "items"):  # stored as JSON arrays
            data[key] = tuple(data.get(key, ()))
        return cls(**data)

    def render_text(self) -> str:
        """The chunk as the model reads it: span, summary, then the verbatim ledger."""
        span = (
            f"Turns {self.first_seq}-{self.last_seq}"
            if self.first_seq != self.last_seq
            else f"Turn {self.first_seq}"
        )
        text = f"## {span}\n{self.text.strip()}"
        if self.artifacts:
            ledger = "\n".join(f"- {a}" for a in self.artifacts)
            text += f"\n\nVerbatim references:\n{ledger}"
        return text


@dataclass(frozen=True, slots=True)
class EffectiveHistory:
    """What the runtime sends to its model next, before rendering."""

    chunks: tuple[SummaryChunk, ...]
    entries: tuple[Entry, ...]
    version: int = 0
    system_prompt: str | None = None
    tools: tuple[Mapping[str, Any], ...] | None = None

    def with_parts(self, chunks: Iterable[SummaryChunk], entries: Iterable[Entry]) -> EffectiveHistory:
        return replace(self, chunks=tuple(chunks), entries=tuple(entries))


def public_message(message: Mapping[str, Any]) -> dict[str, Any]:
    """A stored message without this service's private fields."""
    return {k: v for k, v in message.items() if k not in PRIVATE_FIELDS}


def text_of(message: Mapping[str, Any]) -> str:
    """The text of a message's content (text parts joined; other parts ignored)."""
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    parts = [p.get("text") or "" for p in content if isinstance(p, Mapping) and p.get("type") == "text"]
    return "\n".join(parts)


def text_with_calls(message: Mapping[str, Any], mark: str = "") -> str:
    """A message's text, then each tool call it issues as ``name(arguments)`` (after ``mark``), one a line."""
    parts = [text_of(message)]
    for call in message.get("tool_calls") or ():
        function = call.get("function") if isinstance(call, Mapping) else None
        if isinstance(function, Mapping):
            parts.append(f"{mark}{function.get('name') or ''}({function.get('arguments') or ''})")
    return "\n".join(p for p in parts if p)


def summary_message_text(chunks: Sequence[SummaryChunk]) -> str:
    """The text of the single user message that carries every summary chunk."""
    return "\n\n".join(summary_chunk_texts(chunks))


def summary_chunk_texts(chunks: Sequence[SummaryChunk]) -> list[str]:
    """The summary turn's text by chunk, in order, the summary's heading leading the first (a
    format with content blocks sends one block each: a chunk added later leaves the others as
    they were)."""
    heading = f"{SUMMARY_HEADER}\n"
    texts = [chunk.render_text() for chunk in chunks]
    return [heading + texts[0], *texts[1:]] if texts else [heading]


def is_summary_text(text: str) -> bool:
    """Whether a message text carries summary chunks (it starts with the tag, whatever the placement)."""
    return text.lstrip().startswith(SUMMARY_HEADER)


def render(
    history: EffectiveHistory, placement: SummaryPlacement = "separate", *, private: bool = False
) -> list[dict[str, Any]]:
    """Provider-ready messages: one system message, the summary, then the entries, in transcript order.

    System-role entries are hoisted into the leading system message (a second system
    message mid-history is rejected by some providers); the restored working state
    (``RESTORED``) follows the summary chunks in the summary turn. Entries older than every
    chunk (the task, a message pinned early) come before the summary turn, where they were
    said: they never change from one compaction to the next, so they stay in the prefix a
    provider's prompt cache serves. The summary never becomes a system message; it is tagged
    with ``SUMMARY_HEADER`` in either placement:

    - ``separate`` (reference 000): a user message, followed by a short assistant
      acknowledgment unless the next message is already the assistant's, so roles keep
      alternating.
    - ``merge`` (reference 001): when the first non-system message after the summary's place
      is a user message with text, the summary is prepended to that text (string content, or
      the first text part of list content) and no acknowledgment is needed; otherwise as
      ``separate``.

    ``private`` keeps the entries' private fields (``native``), for a format adapter to render
    the history in the runtime's own format (:mod:`compaction_worker.formats.rendering`).
    The summary and acknowledgment are made here and never carry any.
    """
    system_texts = [history.system_prompt] if history.system_prompt else []
    body: list[dict[str, Any]] = []
    ordinals: list[int] = []
    standing: list[str] = []
    restored: list[str] = []
    for entry in history.entries:
        if entry.role == "system":
            system_texts.append(text_of(entry.message))
        elif entry.edit == STANDING and history.chunks:
            standing.append(text_of(entry.message))
        elif entry.edit == RESTORED and history.chunks:
            restored.append(text_of(entry.message))
        else:
            body.append(dict(entry.message) if private else public_message(entry.message))
            ordinals.append(entry.n)
    out: list[dict[str, Any]] = []
    if system_texts:
        out.append({"role": "system", "content": "\n\n".join(system_texts)})
    if history.chunks:
        lead = _lead(body, ordinals, history.chunks[0].first_n)
        out.extend(body[:lead])
        body = body[lead:]
        summary = "\n\n".join([summary_message_text(history.chunks), *standing, *restored])
        merged = _prepend_text(body[0], summary) if placement == "merge" and body else None
        if merged is not None:
            body[0] = merged
        else:
            out.append({"role": "user", "content": summary})
            if not body or body[0]["role"] != "assistant":
                out.append({"role": "assistant", "content": SUMMARY_ACK})
    out.extend(body)
    return out


def _lead(body: Sequence[Mapping[str, Any]], ordinals: Sequence[int], first_n: int) -> int:
    """How many of ``body``'s messages go before the summary turn: those older than the chunks
    (``first_n``: the first one's start), when they start with the user's and leave no tool call
    open; else none."""
    lead = next((i for i, n in enumerate(ordinals) if n >= first_n), len(body))
    if not lead or body[0].get("role") != "user" or body[lead - 1].get("tool_calls"):
        return 0
    return lead


def _prepend_text(message: dict[str, Any], text: str) -> dict[str, Any] | None:
    """``message`` with ``text`` before its own, or None unless it is a user message with text."""
    if message.get("role") != "user":
        return None
    content = message.get("content")
    if isinstance(content, str):
        return {**message, "content": f"{text}\n\n{content}" if content else text}
    if isinstance(content, list):
        for i, part in enumerate(content):
            if isinstance(part, Mapping) and part.get("type") == "text":
                own = part.get("text") or ""
                merged_part = {**part, "text": f"{text}\n\n{own}" if own else text}
                return {**message, "content": [*content[:i], merged_part, *content[i + 1 :]]}
    return None
