"""Shared by the contract tests: example events, the committed files, a small schema checker."""

from __future__ import annotations

import json
import typing
import uuid
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel

from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    EVENT_MODELS,
    PROPOSED_TOPIC,
    STARTED_TOPIC,
    TURNS_TOPIC,
    ChatMessage,
    CompactionCompleted,
    CompactionMode,
    CompactionProposed,
    CompactionRequest,
    CompactionStarted,
    ContentPart,
    ContextStatus,
    DeadLetter,
    DeadLetterReason,
    FunctionCall,
    LlmUsage,
    Outcome,
    ToolCall,
    Trigger,
    TurnEvent,
    Usage,
)
from compaction_worker.contracts.json_schemas import schema_file
from compaction_worker.contracts.specification import ASYNCAPI_FILE

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
TOPICS = {TURNS_TOPIC, STARTED_TOPIC, COMPLETED_TOPIC, PROPOSED_TOPIC, DLQ_TOPIC}
SCHEMA_FILES = [schema_file(topic) for topic in EVENT_MODELS]

# Keywords whose meaning is the same in draft-07 (the base of AsyncAPI's default schema
# format, which the payload $refs use) and in draft 2020-12 (what the files declare).
PORTABLE_KEYWORDS = {
    "$schema", "$id", "$comment", "$ref", "$defs", "title", "description", "default",
    "examples", "deprecated", "readOnly", "writeOnly", "type", "enum", "const", "properties",
    "required", "additionalProperties", "patternProperties", "propertyNames", "minProperties",
    "maxProperties", "items", "minItems", "maxItems", "uniqueItems", "minLength", "maxLength",
    "pattern", "format", "minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
    "multipleOf", "anyOf", "oneOf", "allOf", "not", "if", "then", "else", "contentEncoding",
    "contentMediaType",
}  # fmt: skip
ANNOTATIONS = {"title", "description", "default", "examples", "deprecated", "$comment"}


# --- examples produced by the models ------------------------------------------------------


def example_events() -> dict[str, BaseModel]:
    """One realistic event per topic, built through the models (so they are valid by definition)."""
    cid = "conv-42"
    compaction_id = uuid.UUID(int=7)
    return {
        TURNS_TOPIC: TurnEvent(
            conversation_id=cid,
            turn_seq=3,
            model="openai/gpt-4o-mini",
            system_prompt="You are terse.",
            messages=[
                ChatMessage(
                    role="user",
                    content=[
                        ContentPart(type="text", text="What is in this picture and in /etc?"),
                        ContentPart(type="image_url", image_url={"url": "data:image/png;base64,AA=="}),
                    ],
                ),
                ChatMessage(
                    role="assistant",
                    tool_calls=[
                        ToolCall(
                            id="call_1",
                            function=FunctionCall(name="ls", arguments='{"path": "/etc"}'),
                        )
                    ],
                ),
                ChatMessage(role="tool", tool_call_id="call_1", content="hosts\npasswd"),
            ],
            tools=[{"type": "function", "function": {"name": "ls", "parameters": {"type": "object"}}}],
            context_window=128_000,
            max_output_tokens=4_096,
            usage=Usage(prompt_tokens=1_200, completion_tokens=30),
            compaction=CompactionRequest(
                mode=CompactionMode.OVERFLOW, error="prompt is too long: 130000 tokens"
            ),
        ),
        STARTED_TOPIC: CompactionStarted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.THRESHOLD,
            model="openai/gpt-4o-mini",
            tokens_before=104_000,
            window=128_000,
            threshold=99_000,
            target=62_000,
            version=2,
        ),
        COMPLETED_TOPIC: CompactionCompleted(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.THRESHOLD,
            outcome=Outcome.COMPACTED,
            stages=["prune", "summarize"],
            tokens_before=104_000,
            tokens_after=40_000,
            messages_before=120,
            messages_after=9,
            summary_tokens=900,
            summarizer_model="openai/gpt-4o-mini",
            llm_usage=LlmUsage(
                calls=1,
                prompt_tokens=60_000,
                completion_tokens=900,
                total_tokens=60_900,
                cost_usd=0.01,
            ),
            window=128_000,
            target=62_000,
            version=3,
            context_status=ContextStatus.SUMMARIZED,
            duration_ms=5_300,
        ),
        PROPOSED_TOPIC: CompactionProposed(
            conversation_id=cid,
            compaction_id=compaction_id,
            trigger=Trigger.THRESHOLD,
            version=2,
            last_seq=57,
            stages=["summarize"],
            tokens_before=104_000,
            tokens_after=40_000,
            messages_before=120,
            messages_after=9,
            summary="[summary of earlier conversation]\nThe user is migrating auth to OAuth2.",
            summarizer_model="openai/gpt-4o-mini",
        ),
        DLQ_TOPIC: DeadLetter(
            reason=DeadLetterReason.MALFORMED_JSON.value,
            detail="Expecting value: line 1 column 1 (char 0)",
            source_topic=TURNS_TOPIC,
            partition=3,
            offset=1_234,
            key_b64="Y29udi00Mg==",
            original_b64="bm90IGpzb24=",
            original_size=8,
        ),
    }


def wire(event: BaseModel) -> dict[str, Any]:
    """The event as the worker writes it to Kafka, parsed back."""
    return typing.cast(dict[str, Any], json.loads(event.model_dump_json()))


def load_schema(topic: str) -> dict[str, Any]:
    """The committed JSON Schema of one topic."""
    return typing.cast(dict[str, Any], json.loads((SCHEMAS_DIR / schema_file(topic)).read_text()))


def load_asyncapi() -> dict[str, Any]:
    """The committed AsyncAPI document."""
    return typing.cast(dict[str, Any], yaml.safe_load((SCHEMAS_DIR / ASYNCAPI_FILE).read_text()))


def resolve_pointer(document: Any, pointer: str) -> Any:
    """Follow a JSON pointer (``/a/b``, RFC 6901 escapes) through a document."""
    node = document
    for raw in filter(None, pointer.split("/")):
        token = raw.replace("~1", "/").replace("~0", "~")
        node = node[int(token)] if isinstance(node, list) else node[token]
    return node


def refs(node: Any) -> Iterator[str]:
    """Every ``$ref`` value anywhere in a document."""
    if isinstance(node, dict):
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                yield value
            else:
                yield from refs(value)
    elif isinstance(node, list):
        for item in node:
            yield from refs(item)


def subschemas(schema: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """A schema and every schema nested in it (not the property-name maps themselves)."""
    yield schema
    for keyword in ("properties", "$defs", "patternProperties"):
        for child in schema.get(keyword, {}).values():
            yield from subschemas(child)
    for keyword in ("anyOf", "oneOf", "allOf"):
        for child in schema.get(keyword, []):
            yield from subschemas(child)
    for keyword in ("items", "additionalProperties", "not", "if", "then", "else", "propertyNames"):
        child = schema.get(keyword)
        if isinstance(child, dict):
            yield from subschemas(child)


def enums_used(model: type[BaseModel]) -> set[type[StrEnum]]:
    """The StrEnums a model's fields use, directly or through nested models."""
    found: set[type[StrEnum]] = set()
    pending: list[Any] = [field.annotation for field in model.model_fields.values()]
    seen: set[Any] = set()
    while pending:
        annotation = pending.pop()
        if isinstance(annotation, type) and issubclass(annotation, StrEnum):
            found.add(annotation)
        elif isinstance(annotation, type) and issubclass(annotation, BaseModel):
            if annotation not in seen:
                seen.add(annotation)
                pending.extend(field.annotation for field in annotation.model_fields.values())
        else:
            pending.extend(typing.get_args(annotation))
    return found


def structural_errors(schema: dict[str, Any], payload: dict[str, Any]) -> list[str]:
    """What a payload gets wrong at the top level: missing or unknown properties, bad enums."""
    errors = [f"missing {name}" for name in schema.get("required", []) if name not in payload]
    if schema.get("additionalProperties") is False:
        errors += [f"unknown {name}" for name in payload if name not in schema["properties"]]
    for name, value in payload.items():
        prop = schema["properties"].get(name, {})
        if "$ref" in prop:
            prop = resolve_pointer(schema, prop["$ref"].removeprefix("#"))
        if "enum" in prop and value not in prop["enum"]:
            errors.append(f"{name}: {value!r} not in {prop['enum']}")
        if "const" in prop and value != prop["const"]:
            errors.append(f"{name}: {value!r} is not {prop['const']!r}")
    return errors
