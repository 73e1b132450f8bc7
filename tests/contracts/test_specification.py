"""The published contracts: committed files match the models, and say what the models do."""

from __future__ import annotations

import json
import typing
import uuid
from collections.abc import Iterator
from datetime import datetime
from enum import StrEnum
from pathlib import Path
from typing import Any

import pytest
import yaml
from pydantic import BaseModel

from compaction_worker.contracts import events
from compaction_worker.contracts.events import (
    EVENT_MODELS,
    ChatMessage,
    CompactionCompleted,
    CompactionMode,
    CompactionRequest,
    CompactionStarted,
    ContentPart,
    ContextStatus,
    DeadLetter,
    FunctionCall,
    LlmUsage,
    Outcome,
    ToolCall,
    Trigger,
    TurnEvent,
    Usage,
)
from compaction_worker.contracts.specification import (
    ASYNCAPI_FILE,
    GENERATED_NOTE,
    INPUT_TOPICS,
    JSON_SCHEMA_DIALECT,
    check,
    render_all,
    schema_file,
    write,
)
from compaction_worker.errors import DeadLetterReason
from compaction_worker.state import keys

SCHEMAS_DIR = Path(__file__).resolve().parents[2] / "schemas"
TOPICS = {keys.TURNS_TOPIC, keys.STARTED_TOPIC, keys.COMPLETED_TOPIC, keys.DLQ_TOPIC}
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
        keys.TURNS_TOPIC: TurnEvent(
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
        keys.STARTED_TOPIC: CompactionStarted(
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
        keys.COMPLETED_TOPIC: CompactionCompleted(
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
        keys.DLQ_TOPIC: DeadLetter(
            reason=DeadLetterReason.MALFORMED_JSON.value,
            detail="Expecting value: line 1 column 1 (char 0)",
            source_topic=keys.TURNS_TOPIC,
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


# --- the committed files ------------------------------------------------------------------


class TestDrift:
    """The committed files in schemas/ are exactly what the models generate."""

    def test_committed_files_match_the_models(self) -> None:
        """CI fails when a model changed and the contracts were not regenerated."""
        problems = check(SCHEMAS_DIR)
        assert problems == [], (
            "schemas/ is out of date with compaction_worker/contracts/events.py; run "
            "`compaction-worker schemas` and commit the result:\n  " + "\n  ".join(problems)
        )

    def test_one_file_per_event_plus_asyncapi(self) -> None:
        """Every topic of EVENT_MODELS has its schema file, named after the topic."""
        assert set(render_all()) == {f"{topic}.json" for topic in TOPICS} | {ASYNCAPI_FILE}

    def test_rendering_is_deterministic(self) -> None:
        """Two renderings are byte-identical, so a diff only ever shows a model change."""
        assert render_all() == render_all()

    def test_json_files_are_sorted_indented_and_end_with_a_newline(self) -> None:
        """The JSON files are in their canonical form (sorted keys, 2-space indent, LF)."""
        for name in SCHEMA_FILES:
            text = render_all()[name]
            assert text == json.dumps(json.loads(text), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            assert "\r" not in text


# --- the JSON Schemas ---------------------------------------------------------------------


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
    schema = load_schema(keys.TURNS_TOPIC)
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
        validator = validator_for(keys.TURNS_TOPIC)
        payload = wire(example_events()[keys.TURNS_TOPIC])
        payload["messages"][0]["role"] = "robot"
        assert not validator.is_valid(payload)
        payload = wire(example_events()[keys.TURNS_TOPIC])
        del payload["messages"][1]["tool_calls"][0]["id"]
        assert not validator.is_valid(payload)

    def test_timestamps_and_ids_are_in_the_declared_formats(self, validator_for: Any) -> None:
        """The wire format of timestamp and event_id is the declared one (date-time, uuid)."""
        schema = load_schema(keys.STARTED_TOPIC)
        payload = wire(example_events()[keys.STARTED_TOPIC])
        assert schema["properties"]["timestamp"]["format"] == "date-time"
        assert datetime.fromisoformat(payload["timestamp"]).tzinfo is not None
        assert schema["properties"]["event_id"]["format"] == "uuid"
        assert uuid.UUID(payload["event_id"])
        assert validator_for(keys.STARTED_TOPIC).is_valid(payload)


# --- the AsyncAPI document ----------------------------------------------------------------


class TestAsyncApi:
    """The AsyncAPI document describes the four topics, their keys and who sends what."""

    def test_parses_as_asyncapi_3(self) -> None:
        """The file is YAML, AsyncAPI 3.0.0, with a title, a version and prose."""
        document = load_asyncapi()
        assert document["asyncapi"] == "3.0.0"
        assert document["info"]["title"] == "compaction-worker"
        assert document["info"]["version"]
        for topic in (keys.TURNS_TOPIC, keys.DLQ_TOPIC):
            assert topic in document["info"]["description"]

    def test_one_channel_per_topic(self) -> None:
        """Each default topic name from keys.py is the address of exactly one channel."""
        addresses = [channel["address"] for channel in load_asyncapi()["channels"].values()]
        assert sorted(addresses) == sorted(TOPICS)

    def test_the_worker_receives_turns_and_sends_the_rest(self) -> None:
        """Actions are from the worker's point of view: receive the input, send the outputs."""
        document = load_asyncapi()
        actions = {
            resolve_pointer(document, operation["channel"]["$ref"][1:])["address"]: operation["action"]
            for operation in document["operations"].values()
        }
        assert actions == {topic: "receive" if topic in INPUT_TOPICS else "send" for topic in TOPICS}

    def test_operation_messages_belong_to_their_channel(self) -> None:
        """An operation may only name messages of the channel it operates on (AsyncAPI 3 rule)."""
        for operation in load_asyncapi()["operations"].values():
            channel_ref = operation["channel"]["$ref"]
            for message in operation["messages"]:
                assert message["$ref"].startswith(channel_ref + "/messages/")

    def test_every_ref_resolves(self) -> None:
        """Every $ref names a component in the document or a file (and pointer) that exists."""
        document = load_asyncapi()
        checked = 0
        for ref in refs(document):
            target, _, fragment = ref.partition("#")
            if target:
                path = SCHEMAS_DIR / target
                assert path.is_file(), ref
                resolved = resolve_pointer(json.loads(path.read_text()), fragment)
            else:
                resolved = resolve_pointer(document, fragment)
            assert isinstance(resolved, dict), ref
            checked += 1
        assert checked >= 4 * 4  # channel, operation, message and schema refs of four topics

    def test_payloads_are_the_event_schemas(self) -> None:
        """Each channel's message payload is the schema file of that channel's topic."""
        document = load_asyncapi()
        for channel in document["channels"].values():
            (message_ref,) = (m["$ref"] for m in channel["messages"].values())
            message = resolve_pointer(document, message_ref[1:])
            payload = resolve_pointer(document, message["payload"]["$ref"][1:])
            assert payload == {"$ref": f"./{schema_file(channel['address'])}"}

    def test_kafka_key_is_the_conversation_id(self) -> None:
        """Every message declares its Kafka key; conversation events carry the id's constraints."""
        document = load_asyncapi()
        turn_id = load_schema(keys.TURNS_TOPIC)["properties"]["conversation_id"]
        for channel in document["channels"].values():
            (message_ref,) = (m["$ref"] for m in channel["messages"].values())
            key = resolve_pointer(document, message_ref[1:])["bindings"]["kafka"]["key"]
            assert "conversation_id" in key["description"] or "conversation id" in key["description"]
            if channel["address"] != keys.DLQ_TOPIC:
                assert key["type"] == "string"
                assert key["pattern"] == turn_id["pattern"]
                assert key["maxLength"] == turn_id["maxLength"]

    def test_server_has_a_bootstrap_variable(self) -> None:
        """The Kafka server's host is the ``{bootstrap}`` variable, with a default."""
        (server,) = load_asyncapi()["servers"].values()
        assert server["protocol"] == "kafka"
        assert server["host"] == "{bootstrap}"
        assert server["variables"]["bootstrap"]["default"]

    def test_describes_ordering_deduplication_and_dead_letters(self) -> None:
        """The prose covers the key, the de-duplication ids and every dead-letter reason."""
        document = load_asyncapi()
        text = document["info"]["description"]
        for phrase in (
            "## Ordering",
            "## De-duplication",
            "## Dead letters",
            "event_id",
            "turn_seq",
            "version",
        ):
            assert phrase in text
        dlq = next(c for c in document["channels"].values() if c["address"] == keys.DLQ_TOPIC)
        for reason in DeadLetterReason:
            assert f"`{reason.value}`" in dlq["description"]


# --- write() and check() ------------------------------------------------------------------


class TestWriteAndCheck:
    """write() brings a directory up to date; check() says how it differs."""

    def test_fresh_directory_is_written_and_then_clean(self, tmp_path: Path) -> None:
        """A new directory gets every file, byte for byte, and check() then finds nothing."""
        written = write(tmp_path / "schemas")
        assert sorted(path.name for path in written) == sorted(render_all())
        assert check(tmp_path / "schemas") == []
        for name, text in render_all().items():
            assert (tmp_path / "schemas" / name).read_bytes() == text.encode()

    def test_up_to_date_files_are_not_rewritten(self, tmp_path: Path) -> None:
        """A second write() changes nothing and returns nothing."""
        write(tmp_path)
        assert write(tmp_path) == []

    def test_changed_file_is_reported(self, tmp_path: Path) -> None:
        """An edited schema is reported by name and line, and write() repairs it."""
        write(tmp_path)
        path = tmp_path / schema_file(keys.COMPLETED_TOPIC)
        path.write_text(path.read_text().replace('"minimum": 0', '"minimum": 1', 1))
        (problem,) = check(tmp_path)
        assert str(path) in problem
        assert "differs" in problem
        assert "line " in problem
        assert write(tmp_path) == [path]
        assert check(tmp_path) == []

    def test_missing_file_is_reported(self, tmp_path: Path) -> None:
        """A deleted file is reported as missing."""
        write(tmp_path)
        (tmp_path / ASYNCAPI_FILE).unlink()
        assert check(tmp_path) == [f"{tmp_path / ASYNCAPI_FILE}: missing"]

    def test_missing_directory_reports_every_file(self, tmp_path: Path) -> None:
        """A directory that does not exist is every file missing."""
        problems = check(tmp_path / "nowhere")
        assert len(problems) == len(render_all())
        assert all(problem.endswith(": missing") for problem in problems)

    def test_stale_generated_file_is_extra_and_removed(self, tmp_path: Path) -> None:
        """A generated file no model produces any more is reported, then removed by write()."""
        write(tmp_path)
        stale = tmp_path / "conversation.renamed.json"
        stale.write_text(json.dumps({"$comment": GENERATED_NOTE}))
        assert check(tmp_path) == [f"{stale}: extra, no event model produces it"]
        write(tmp_path)
        assert not stale.exists()
        assert check(tmp_path) == []

    def test_files_we_did_not_generate_are_left_alone(self, tmp_path: Path) -> None:
        """A hand-written file in the directory is neither reported nor removed."""
        write(tmp_path)
        mine = tmp_path / "extra-notes.json"
        mine.write_text("{}")
        assert check(tmp_path) == []
        write(tmp_path)
        assert mine.exists()

    def test_crlf_checkout_is_reported(self, tmp_path: Path) -> None:
        """Line-ending changes count as drift, so the committed bytes stay canonical."""
        write(tmp_path)
        path = tmp_path / schema_file(keys.TURNS_TOPIC)
        path.write_bytes(path.read_bytes().replace(b"\n", b"\r\n"))
        (problem,) = check(tmp_path)
        assert str(path) in problem
