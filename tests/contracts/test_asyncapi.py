"""The AsyncAPI document FastStream generates: the four topics, their keys and headers, and who sends what."""

from __future__ import annotations

from typing import Any

from compaction_worker.contracts.events import DLQ_TOPIC, EVENT_MODELS, TURNS_TOPIC, DeadLetterReason
from compaction_worker.contracts.json_schemas import INPUT_TOPICS
from compaction_worker.runtime.channels import DOCUMENTED_BOOTSTRAP
from tests.contracts.helpers import TOPICS, load_asyncapi, load_schema, refs, resolve_pointer


def messages_by_topic(document: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each channel's one message (resolved), by the channel's address."""
    found = {}
    for channel in document["channels"].values():
        (reference,) = (m["$ref"] for m in channel["messages"].values())
        found[channel["address"]] = resolve_pointer(document, reference[1:])
    return found


class TestAsyncApi:
    """The committed document describes the four topics, their keys and who sends what."""

    def test_parses_as_asyncapi_3(self) -> None:
        """The file is YAML, AsyncAPI 3.0.0, with a title, a version and prose."""
        document = load_asyncapi()
        assert document["asyncapi"] == "3.0.0"
        assert document["info"]["title"] == "compaction-worker"
        assert document["info"]["version"]
        for topic in (TURNS_TOPIC, DLQ_TOPIC):
            assert topic in document["info"]["description"]

    def test_one_channel_per_topic(self) -> None:
        """Each default topic name is the address of exactly one channel."""
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

    def test_every_ref_resolves_inside_the_document(self) -> None:
        """Every $ref names a part of the document itself: the payloads are inline, not files."""
        document = load_asyncapi()
        found = list(refs(document))
        for ref in found:
            assert ref.startswith("#/"), ref
            assert isinstance(resolve_pointer(document, ref[1:]), dict), ref
        assert len(found) >= 4 * 4  # channel, operation, message and payload refs of four topics

    def test_payloads_are_the_models_schemas(self) -> None:
        """Each message's payload is its topic's model, as pydantic describes it, with every definition."""
        document = load_asyncapi()
        schemas = document["components"]["schemas"]
        for topic, message in messages_by_topic(document).items():
            model = EVENT_MODELS[topic]
            expected = model.model_json_schema(ref_template="#/components/schemas/{model}")
            definitions = expected.pop("$defs", {})
            assert message["payload"] == {"$ref": f"#/components/schemas/{model.__name__}"}
            assert schemas[model.__name__] == expected
            for name, definition in definitions.items():
                assert schemas[name] == definition, name

    def test_payloads_agree_with_the_json_schema_files(self) -> None:
        """The document and the files name the same fields; the input's schema is the file's exactly.

        An output's file is in serialization mode (every field the worker always writes is
        required); FastStream describes a payload as its model validates, so the document
        may require fewer of an output's fields, never others.
        """
        document = load_asyncapi()
        for topic, message in messages_by_topic(document).items():
            payload = resolve_pointer(document, message["payload"]["$ref"][1:])
            committed = load_schema(topic)
            assert set(payload["properties"]) == set(committed["properties"]), topic
            assert set(payload.get("required", [])) <= set(committed["required"]), topic
            if topic in INPUT_TOPICS:
                assert payload["required"] == committed["required"]
                assert payload["properties"] == {
                    name: _local_refs(field) for name, field in committed["properties"].items()
                }

    def test_kafka_key_is_the_conversation_id(self) -> None:
        """Every message declares its Kafka key; conversation events carry the id's constraints."""
        document = load_asyncapi()
        turn_id = load_schema(TURNS_TOPIC)["properties"]["conversation_id"]
        for topic, message in messages_by_topic(document).items():
            key = message["bindings"]["kafka"]["key"]
            assert "conversation_id" in key["description"] or "conversation id" in key["description"]
            if topic != DLQ_TOPIC:
                assert key["type"] == "string"
                assert key["pattern"] == turn_id["pattern"]
                assert key["maxLength"] == turn_id["maxLength"]

    def test_messages_declare_the_trace_headers(self) -> None:
        """traceparent and tracestate are optional headers on every topic."""
        for message in messages_by_topic(load_asyncapi()).values():
            headers = message["headers"]
            assert set(headers["properties"]) == {"traceparent", "tracestate"}
            assert "required" not in headers

    def test_server_names_the_bootstrap_setting(self) -> None:
        """One Kafka server, the default bootstrap address, with the setting that replaces it."""
        (server,) = load_asyncapi()["servers"].values()
        assert server["protocol"] == "kafka"
        assert server["host"] == DOCUMENTED_BOOTSTRAP
        assert "COMPACTION_KAFKA__BOOTSTRAP_SERVERS" in server["description"]

    def test_describes_ordering_deduplication_dead_letters_and_headers(self) -> None:
        """The prose covers the key, the de-duplication ids, every dead-letter reason and the headers."""
        document = load_asyncapi()
        text = document["info"]["description"]
        for phrase in (
            "## Ordering",
            "## De-duplication",
            "## Dead letters",
            "## Headers",
            "event_id",
            "turn_seq",
            "version",
            "traceparent",
        ):
            assert phrase in text
        dlq = next(c for c in document["channels"].values() if c["address"] == DLQ_TOPIC)
        for reason in DeadLetterReason:
            assert f"`{reason.value}`" in dlq["description"]

    def test_each_channel_names_the_setting_that_renames_it(self) -> None:
        """A deployment that renames a topic finds the variable on the channel."""
        for channel in load_asyncapi()["channels"].values():
            assert "COMPACTION_TOPICS__" in channel["description"]


def _local_refs(node: Any) -> Any:
    """A file's schema with its ``#/$defs/`` references pointing where the document keeps definitions."""
    if isinstance(node, dict):
        return {
            key: value.replace("#/$defs/", "#/components/schemas/") if key == "$ref" else _local_refs(value)
            for key, value in node.items()
        }
    if isinstance(node, list):
        return [_local_refs(item) for item in node]
    return node
