"""The effective history rendered in a runtime's own format, reasoning kept.

A runtime that publishes Anthropic messages or Responses items gets them back, not their
chat form: the verbatim tail's ``thinking``/``redacted_thinking`` blocks (with their
signatures), ``reasoning`` items (with ``encrypted_content``) and Gemini thought signatures
come back exactly as stored, from the private ``native`` field the adapters keep. The
summary and its acknowledgment are plain text messages made by
:func:`~compaction_worker.contracts.history.render`: they carry no reasoning, and the
summarizers never read any (they read content and tool calls only), so a summary never
claims to hold a signed block it could not reproduce.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal, TypeAlias, get_args, overload

from compaction_worker.contracts.history import (
    EffectiveHistory,
    SummaryPlacement,
    is_summary_text,
    render,
    summary_chunk_texts,
)
from compaction_worker.formats import anthropic, gemini, openai_chat, responses
from compaction_worker.formats._common import FormatError
from compaction_worker.formats.anthropic import AnthropicMessages
from compaction_worker.formats.gemini import GeminiContents

HistoryFormat = Literal["openai", "anthropic", "responses", "gemini"]
"""The formats :func:`rendered` renders: OpenAI chat messages (the stored form), Anthropic
``system``/``messages``, Responses input items, Gemini ``system_instruction``/``contents``."""

FORMATS: tuple[str, ...] = get_args(HistoryFormat)

Rendered: TypeAlias = list[dict[str, Any]] | AnthropicMessages | GeminiContents


@overload
def rendered(
    history: EffectiveHistory,
    fmt: Literal["openai", "responses"] = "openai",
    placement: SummaryPlacement = "separate",
    *,
    cache: bool = False,
) -> list[dict[str, Any]]: ...
@overload
def rendered(
    history: EffectiveHistory,
    fmt: Literal["anthropic"],
    placement: SummaryPlacement = "separate",
    *,
    cache: bool = False,
) -> AnthropicMessages: ...
@overload
def rendered(
    history: EffectiveHistory,
    fmt: Literal["gemini"],
    placement: SummaryPlacement = "separate",
    *,
    cache: bool = False,
) -> GeminiContents: ...
def rendered(
    history: EffectiveHistory,
    fmt: HistoryFormat = "openai",
    placement: SummaryPlacement = "separate",
    *,
    cache: bool = False,
) -> Rendered:
    """``history`` as ``fmt`` takes it (see the module docstring); :class:`FormatError` for another name.

    ``cache`` places Anthropic's prompt-cache breakpoints (``cache_control``) after the system
    prompt, the summary chunks (one text block each) and the last message
    (:func:`~compaction_worker.formats.anthropic.with_cache_breakpoints`); the other providers
    cache a prompt's prefix without being told, and it changes nothing for them.
    """
    messages = render(history, placement, private=True)
    if fmt == "openai":
        return openai_chat.from_openai(messages)
    if fmt == "anthropic":
        converted = anthropic.from_openai(messages)
        if not cache:
            return converted
        if not history.chunks:
            return anthropic.with_cache_breakpoints(converted, None)
        texts = summary_chunk_texts(history.chunks) if placement == "separate" else []
        turn = next((i for i, m in enumerate(converted.messages) if _summarizes(m)), None)
        return anthropic.with_cache_breakpoints(converted, turn, texts)
    if fmt == "responses":
        return responses.from_openai(messages)
    if fmt == "gemini":
        return gemini.from_openai(messages)
    raise FormatError(f"unknown format {fmt!r}: one of {', '.join(FORMATS)}")


def _summarizes(message: Mapping[str, Any]) -> bool:
    """Whether ``message`` carries the summary turn (a text of it starts with the summary's tag)."""
    content = message.get("content")
    if isinstance(content, str):
        return is_summary_text(content)
    return any(
        isinstance(b, Mapping) and b.get("type") == "text" and is_summary_text(str(b.get("text")))
        for b in content or ()
    )
