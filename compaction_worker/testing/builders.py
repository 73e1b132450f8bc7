"""Builders for tests: turn events, stored conversations, and a token counter to reason with.

:func:`turn_payload` builds a valid ``conversation.turn`` event (:func:`turn_event` as the
model, :func:`turn_bytes` as a record's value); :class:`Chat` builds a
conversation message by message as the store holds it (entries with ordinals and token
counts) and :func:`summary_chunk` an earlier summary; :class:`WordCounter` counts tokens so
that a test can work the numbers out by hand.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, ClassVar

from compaction_worker.contracts.events import TurnEvent
from compaction_worker.contracts.history import Entry, SummaryChunk
from compaction_worker.strategies.draft import Counter, Draft

__all__ = ["Chat", "WordCounter", "summary_chunk", "turn_bytes", "turn_event", "turn_payload"]


class WordCounter:
    """A token counter to work out by hand: one token a word, plus fixed costs per message and image.

    A text costs one token per whitespace-separated word; a message costs
    :attr:`PER_MESSAGE` plus its text parts' words, :attr:`PER_IMAGE` per other part, and
    its tool calls' names and arguments. It has the two methods of the pipeline's
    :class:`~compaction_worker.strategies.draft.Counter`; pass ``WordCounter().text`` where a
    ``count(text) -> int`` is wanted.
    """

    PER_MESSAGE: ClassVar[int] = 4
    PER_IMAGE: ClassVar[int] = 100

    def text(self, text: str) -> int:
        """The words of ``text``."""
        return len(text.split())

    def message(self, message: Mapping[str, Any]) -> int:
        """What ``message`` costs: the per-message cost, its words, images and tool calls."""
        content = message.get("content")
        tokens = self.PER_MESSAGE
        if isinstance(content, str):
            tokens += self.text(content)
        elif isinstance(content, list):
            for part in content:
                tokens += self.text(part["text"]) if part.get("type") == "text" else self.PER_IMAGE
        for call in message.get("tool_calls") or ():
            tokens += self.text(call["function"]["name"]) + self.text(call["function"]["arguments"])
        return tokens


class Chat:
    """Builds a stored conversation one message at a time, each an ``Entry`` as the store makes it.

    Ordinals and turn numbers count up from ``start`` (one message a turn) and each entry's
    tokens are ``counter.message(message)``::

        chat = Chat().user("read it").tool("call_1", "read_file", {"path": "a.py"}, "print(1)")
        draft = chat.draft()  # what a pipeline stage takes
    """

    def __init__(self, start: int = 1, counter: Counter | None = None) -> None:
        self.start = start
        self.counter: Counter = counter or WordCounter()
        self.entries: list[Entry] = []

    @property
    def messages(self) -> list[dict[str, Any]]:
        """The messages so far, in order (e.g. for :func:`turn_payload`)."""
        return [dict(e.message) for e in self.entries]

    def add(
        self,
        message: dict[str, Any],
        *,
        seq: int | None = None,
        tokens: int | None = None,
        edit: str | None = None,
    ) -> Chat:
        """Append ``message`` as the next entry.

        ``seq`` is its turn (default: its ordinal), ``tokens`` its stored count (default:
        the counter's), ``edit`` a stage's edit mark.
        """
        n = self.start + len(self.entries)
        cost = self.counter.message(message) if tokens is None else tokens
        self.entries.append(
            Entry(n=n, seq=n if seq is None else seq, message=message, tokens=cost, edit=edit)
        )
        return self

    def user(self, text: str = "please go on", **kw: Any) -> Chat:
        """A user message."""
        return self.add({"role": "user", "content": text}, **kw)

    def assistant(self, text: str = "done", **kw: Any) -> Chat:
        """An assistant message."""
        return self.add({"role": "assistant", "content": text}, **kw)

    def calls(self, *calls: tuple[str, str, Mapping[str, Any]]) -> Chat:
        """An assistant message making ``(id, tool, arguments)`` calls, in parallel when several."""
        return self.add(
            {
                "role": "assistant",
                "content": None,
                "tool_calls": [
                    {"id": i, "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
                    for i, name, args in calls
                ],
            }
        )

    def result(self, call_id: str, content: str | list[Any], *, pinned: bool = False, **kw: Any) -> Chat:
        """A tool result for ``call_id``; ``pinned`` asks compactions to keep it verbatim."""
        message: dict[str, Any] = {"role": "tool", "tool_call_id": call_id, "content": content}
        if pinned:
            message["pinned"] = True
        return self.add(message, **kw)

    def tool(
        self, call_id: str, name: str, args: Mapping[str, Any], output: str | list[Any], **kw: Any
    ) -> Chat:
        """A call and its result."""
        return self.calls((call_id, name, args)).result(call_id, output, **kw)

    def draft(self, chunks: tuple[SummaryChunk, ...] = ()) -> Draft:
        """The entries after ``chunks`` (earlier summaries), as the pipeline's stages take them."""
        return Draft(chunks, tuple(self.entries))


def summary_chunk(
    first_n: int = 1,
    last_n: int | None = None,
    text: str = "earlier work",
    *,
    tokens: int | None = None,
    **fields: Any,
) -> SummaryChunk:
    """A summary chunk standing for messages ``first_n`` to ``last_n`` (default: ``first_n`` alone).

    Its turns are numbered as its messages and its tokens are :class:`WordCounter`'s count
    of ``text`` unless given; ``fields`` are any other
    :class:`~compaction_worker.contracts.history.SummaryChunk` fields (``id``, ``kept``,
    ``model``, ``first_seq``, ...).
    """
    last = first_n if last_n is None else last_n
    values: dict[str, Any] = {
        "id": "c1",
        "first_seq": first_n,
        "last_seq": last,
        "created_at": "2024-01-01T00:00:00+00:00",
        "model": "fake",
        **fields,
    }
    cost = WordCounter().text(text) if tokens is None else tokens
    return SummaryChunk(text=text, first_n=first_n, last_n=last, tokens=cost, **values)


def turn_payload(
    conversation_id: str,
    turn_seq: int,
    messages: list[dict[str, Any]],
    model: str = "gpt-4o-mini",
    **fields: Any,
) -> dict[str, Any]:
    """Build the JSON dict of a ``conversation.turn`` event, validated by ``TurnEvent``.

    ``fields`` are any other :class:`~compaction_worker.contracts.events.TurnEvent` fields
    (``system_prompt``, ``tools``, ``usage``, ``compaction``, ``event_id``, ...).
    Raises pydantic's ``ValidationError`` when the event would be invalid, and TypeError
    for a field name TurnEvent does not have.
    """
    # TurnEvent ignores unknown fields (forward compatibility), which would turn a typo
    # here into a silently missing field.
    unknown = sorted(set(fields) - set(TurnEvent.model_fields))
    if unknown:
        raise TypeError(f"turn_payload() got fields TurnEvent does not have: {', '.join(unknown)}")
    event = TurnEvent.model_validate(
        {
            "conversation_id": conversation_id,
            "turn_seq": turn_seq,
            "model": model,
            "messages": messages,
            **fields,
        }
    )
    return event.model_dump(mode="json", exclude_none=True)


def turn_event(
    conversation_id: str,
    turn_seq: int,
    messages: list[dict[str, Any]],
    model: str = "gpt-4o-mini",
    **fields: Any,
) -> TurnEvent:
    """The :func:`turn_payload` event as a ``TurnEvent`` (what ``Client.publish_turn`` takes)."""
    return TurnEvent.model_validate(turn_payload(conversation_id, turn_seq, messages, model, **fields))


def turn_bytes(
    conversation_id: str,
    turn_seq: int,
    messages: list[dict[str, Any]],
    model: str = "gpt-4o-mini",
    **fields: Any,
) -> bytes:
    """The :func:`turn_payload` event as a Kafka record's value: its JSON, UTF-8 encoded."""
    return json.dumps(turn_payload(conversation_id, turn_seq, messages, model, **fields)).encode()
