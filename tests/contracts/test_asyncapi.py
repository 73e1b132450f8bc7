"""The AsyncAPI document: the four topics, their keys, and who sends what."""

from __future__ import annotations

import json

from compaction_worker.contracts.events import DLQ_TOPIC, TURNS_TOPIC, DeadLetterReason
from compaction_worker.contracts.json_schemas import INPUT_TOPICS, schema_file
from tests.contracts.helpers import SCHEMAS_DIR, TOPICS, load_asyncapi, load_schema, refs, resolve_pointer


class TestAsyncApi:
    """The AsyncAPI document describes the four topics, their keys and who sends what."""

    def test_parses_as_asyncapi_3(self) -> None:
        """The file is YAML, AsyncAPI 3.0.0, with a title, a version and prose."""
        document = load_asyncapi()
        assert document["asyncapi"] == "3.0.0"
        assert document["info"]["title"] == "compaction-worker"
        assert document["info"]["version"]
        for topic in (TURNS_TOPIC, DLQ_TOPIC):
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
        turn_id = load_schema(TURNS_TOPIC)["properties"]["conversation_id"]
        for channel in document["channels"].values():
            (message_ref,) = (m["$ref"] for m in channel["messages"].values())
            key = resolve_pointer(document, message_ref[1:])["bindings"]["kafka"]["key"]
            assert "conversation_id" in key["description"] or "conversation id" in key["description"]
            if channel["address"] != DLQ_TOPIC:
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
        dlq = next(c for c in document["channels"].values() if c["address"] == DLQ_TOPIC)
        for reason in DeadLetterReason:
            assert f"`{reason.value}`" in dlq["description"]
