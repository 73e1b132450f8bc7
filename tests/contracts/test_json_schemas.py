"""Each topic's JSON Schema says what its model accepts or emits."""

from __future__ import annotations

import uuid
from datetime import datetime
from enum import StrEnum
from typing import Any

import pytest

from compaction_worker.contracts import events
from compaction_worker.contracts.events import EVENT_MODELS, STARTED_TOPIC, TURNS_TOPIC, TurnEvent
from compaction_worker.contracts.json_schemas import GENERATED_NOTE, INPUT_TOPICS, JSON_SCHEMA_DIALECT
from tests.contracts.helpers import (
    ANNOTATIONS,
    PORTABLE_KEYWORDS,
    TOPICS,
    enums_used,
    example_events,
    load_schema,
    refs,
    resolve_pointer,
    structural_errors,
    subschemas,
    wire,
)


@pytest.mark.parametrize("topic", sorted(TOPICS))
class TestEventSchema:
    """Each topic's JSON Schema says what its model accepts or emits."""

    def test_header(self, topic: str) -> None:
        """The schema declares its dialect, an id, a title, a description and its origin."""
        schema = load_schema(topic)
        assert schema["$schema"] == JSON_SCHEMA_DIALECT
        assert schema["$id"].startswith("urn:compaction-worker:schema:" + topic)
        assert schema["title"] == EVENT_MODELS[topic].__name__
        assert schema["description"]
        assert schema["$comment"] == GENERATED_NOTE

    def test_required_fields_are_the_models_required_fields(self, topic: str) -> None:
        """A field without a default is required; an input's defaulted fields are optional."""
        schema = load_schema(topic)
        model = EVENT_MODELS[topic]
        model_required = {name for name, field in model.model_fields.items() if field.is_required()}
        assert set(schema["properties"]) == set(model.model_fields)
        assert model_required <= set(schema["required"]) <= set(schema["properties"])
        if topic in INPUT_TOPICS:
            assert set(schema["required"]) == model_required

    def test_enums_match_the_strenums(self, topic: str) -> None:
        """Every StrEnum the model uses appears in the schema with exactly its values."""
        defs = load_schema(topic).get("$defs", {})
        for enum in enums_used(EVENT_MODELS[topic]):
            assert defs[enum.__name__]["enum"] == [member.value for member in enum]

    def test_extra_fields_follow_the_model_config(self, topic: str) -> None:
        """A model that forbids unknown fields has a schema that forbids them too."""
        forbids = EVENT_MODELS[topic].model_config.get("extra") == "forbid"
        assert (load_schema(topic).get("additionalProperties") is False) == forbids

    def test_every_internal_ref_resolves(self, topic: str) -> None:
        """Each ``#/$defs/...`` reference points at a definition in the same file."""
        schema = load_schema(topic)
        for ref in refs(schema):
            assert ref.startswith("#/"), ref
            assert isinstance(resolve_pointer(schema, ref[1:]), dict), ref

    def test_uses_only_keywords_that_mean_the_same_in_draft_07(self, topic: str) -> None:
        """AsyncAPI reads payloads as draft-07 supersets, so no 2020-12-only keyword may appear."""
        for sub in subschemas(load_schema(topic)):
            assert set(sub) <= PORTABLE_KEYWORDS, set(sub) - PORTABLE_KEYWORDS
            if "$ref" in sub:  # draft-07 ignores a $ref's siblings: only annotations may be there
                assert set(sub) - {"$ref"} <= ANNOTATIONS, sub

    def test_the_example_passes_the_structural_check(self, topic: str) -> None:
        """The event the worker would write has every required field and no unknown one."""
        assert structural_errors(load_schema(topic), wire(example_events()[topic])) == []

    def test_broken_examples_fail_the_structural_check(self, topic: str) -> None:
        """Dropping a required field, adding an unknown one or a bad enum value is caught."""
        schema = load_schema(topic)
        payload = wire(example_events()[topic])
        for name in schema["required"]:
            broken = {k: v for k, v in payload.items() if k != name}
            assert f"missing {name}" in structural_errors(schema, broken)
        if schema.get("additionalProperties") is False:
            assert structural_errors(schema, {**payload, "surprise": 1}) == ["unknown surprise"]
        assert structural_errors(schema, {**payload, "schema_version": 999})


def test_a_minimal_turn_is_valid_input() -> None:
    """Producers may omit every defaulted field (event_id, timestamp...): validation mode."""
    schema = load_schema(TURNS_TOPIC)
    minimal = {
        "conversation_id": "c",
        "turn_seq": 1,
        "model": "gpt-4o",
        "messages": [{"role": "user", "content": "hi"}],
    }
    assert structural_errors(schema, minimal) == []
    TurnEvent.model_validate(minimal)  # and the worker accepts it
    assert {"event_id", "timestamp", "schema_version"}.isdisjoint(schema["required"])


def test_every_strenum_in_events_is_published_somewhere() -> None:
    """Every enum of the events module reaches the contract through at least one schema."""
    published = {name for topic in TOPICS for name in load_schema(topic).get("$defs", {})}
    enums = {
        obj.__name__
        for obj in vars(events).values()
        if isinstance(obj, type) and issubclass(obj, StrEnum) and obj is not StrEnum
    }
    assert enums <= published


class TestWithJsonSchema:
    """Full validation with the jsonschema library, when installed (not a declared dependency)."""

    @pytest.fixture
    def validator_for(self) -> Any:
        jsonschema = pytest.importorskip("jsonschema")

        def make(topic: str) -> Any:
            schema = load_schema(topic)
            jsonschema.Draft202012Validator.check_schema(schema)
            return jsonschema.Draft202012Validator(schema, format_checker=jsonschema.FormatChecker())

        return make

    @pytest.mark.parametrize("topic", sorted(TOPICS))
    def test_example_is_valid(self, validator_for: Any, topic: str) -> None:
        """The event the worker would write validates against its committed schema."""
        errors = [error.message for error in validator_for(topic).iter_errors(wire(example_events()[topic]))]
        assert errors == []

    @pytest.mark.parametrize("topic", sorted(TOPICS))
    def test_broken_examples_are_rejected(self, validator_for: Any, topic: str) -> None:
        """A missing required field, a wrong type or a bad enum value is rejected."""
        validator = validator_for(topic)
        payload = wire(example_events()[topic])
        for name in validator.schema["required"]:
            assert not validator.is_valid({k: v for k, v in payload.items() if k != name}), name
        assert not validator.is_valid({**payload, "event_id": 12})
        assert not validator.is_valid({**payload, "schema_version": 999})
        for name, field in EVENT_MODELS[topic].model_fields.items():
            if isinstance(field.annotation, type) and issubclass(field.annotation, StrEnum):
                assert not validator.is_valid({**payload, name: "bogus"}), name

    def test_nested_message_rules_are_enforced(self, validator_for: Any) -> None:
        """A message with an unknown role, or a tool call without an id, fails the turn schema."""
        validator = validator_for(TURNS_TOPIC)
        payload = wire(example_events()[TURNS_TOPIC])
        payload["messages"][0]["role"] = "robot"
        assert not validator.is_valid(payload)
        payload = wire(example_events()[TURNS_TOPIC])
        del payload["messages"][1]["tool_calls"][0]["id"]
        assert not validator.is_valid(payload)

    def test_timestamps_and_ids_are_in_the_declared_formats(self, validator_for: Any) -> None:
        """The wire format of timestamp and event_id is the declared one (date-time, uuid)."""
        schema = load_schema(STARTED_TOPIC)
        payload = wire(example_events()[STARTED_TOPIC])
        assert schema["properties"]["timestamp"]["format"] == "date-time"
        assert datetime.fromisoformat(payload["timestamp"]).tzinfo is not None
        assert schema["properties"]["event_id"]["format"] == "uuid"
        assert uuid.UUID(payload["event_id"])
        assert validator_for(STARTED_TOPIC).is_valid(payload)
