"""The JSON Schema (draft 2020-12) of each topic's event, generated from its pydantic model."""

from __future__ import annotations

import json
from typing import Any, Literal

from compaction_worker.contracts.events import EVENT_MODELS, SCHEMA_VERSION, TURNS_TOPIC

JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"

INPUT_TOPICS = frozenset({TURNS_TOPIC})
"""Topics the worker consumes; every other topic in ``EVENT_MODELS`` is one it publishes."""

GENERATED_NOTE = (
    "Generated from compaction_worker/contracts/events.py by `compaction-worker schemas`; do not edit."
)
"""Marks a file as generated: ``schemas --check`` reports and ``schemas`` removes stale ones carrying it."""


def schema_file(topic: str) -> str:
    """The file name of one topic's JSON Schema."""
    return f"{topic}.json"


def schema_mode(topic: str) -> Literal["validation", "serialization"]:
    """Validation mode for what the worker accepts, serialization mode for what it emits.

    A producer of an input may leave out every field that has a default, and that is what
    the validation-mode schema says; an output is described as the bytes the worker writes
    (after serializers, computed fields and serialization aliases), which is what consumers
    see, and that is what the serialization-mode schema says.
    """
    return "validation" if topic in INPUT_TOPICS else "serialization"


def event_schema(topic: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one topic's event, from its pydantic model."""
    model = EVENT_MODELS[topic]
    schema = model.model_json_schema(mode=schema_mode(topic))
    direction = "consumes" if topic in INPUT_TOPICS else "publishes"
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": f"urn:compaction-worker:schema:{topic}:v{SCHEMA_VERSION}",
        "$comment": GENERATED_NOTE,
        **schema,
        "title": schema.get("title", model.__name__),
        "description": schema.get("description")
        or f"An event on `{topic}`, which compaction-worker {direction}.",
    }


def render_json(document: dict[str, Any]) -> str:
    """A schema as the file's exact text."""
    # Sorted keys and a fixed indent keep the diff of a model change down to that change.
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"
