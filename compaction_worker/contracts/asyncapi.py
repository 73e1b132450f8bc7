"""The AsyncAPI 3.0 document of the worker: its Kafka server, channels, operations and messages.

Its prose derives from the event models, the topic names and the settings defaults; a
field it describes that the models lose fails generation (:class:`SpecificationError`).
"""

from __future__ import annotations

import re
import textwrap
import typing
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from compaction_worker import __version__
from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    EVENT_MODELS,
    STARTED_TOPIC,
    TURNS_TOPIC,
    CompactionMode,
    DeadLetterReason,
    Outcome,
)
from compaction_worker.contracts.json_schemas import (
    GENERATED_NOTE,
    INPUT_TOPICS,
    schema_file,
    schema_mode,
    schema_version,
)
from compaction_worker.errors import CompactionWorkerError
from compaction_worker.settings import KafkaSettings, Settings, TopicSettings

ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING_VERSION = "0.5.0"  # the Kafka bindings version that goes with AsyncAPI 3.0


class SpecificationError(CompactionWorkerError):
    """The models no longer carry a field that the published contract describes."""


def _camel(topic: str) -> str:
    head, *rest = topic.replace("-", ".").replace("_", ".").split(".")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def _summary(model: type[BaseModel]) -> str:
    """A model's first docstring sentence, without the leading topic name that the title repeats."""
    lines = (model.__doc__ or model.__name__).strip().splitlines()
    sentence = re.sub(r"^``[^`]+``:\s*", "", lines[0]).split(". ")[0].rstrip(".")
    return sentence[:1].upper() + sentence[1:] + "."


def _prose(text: str, width: int = 88) -> str:
    """Wrap each paragraph, so that YAML writes prose as readable literal blocks."""
    paragraphs = text.strip().split("\n\n")
    wrapped = [
        paragraph
        if paragraph.startswith("#")
        else textwrap.fill(" ".join(paragraph.split()), width, break_on_hyphens=False, break_long_words=False)
        for paragraph in paragraphs
    ]
    joined = "\n\n".join(wrapped)
    return joined + "\n" if "\n" in joined else joined


def _require_fields(model: type[BaseModel], *names: str) -> None:
    # The prose below names these fields; a renamed field must fail generation, not go stale.
    missing = [name for name in names if name not in model.model_fields]
    if missing:
        raise SpecificationError(
            f"{model.__name__} lacks {', '.join(missing)}, which the AsyncAPI document describes"
        )


def _literal_values(model: type[BaseModel], field: str) -> list[str]:
    values: list[str] = []
    pending: list[Any] = [model.model_fields[field].annotation]
    while pending:
        annotation = pending.pop(0)
        if typing.get_origin(annotation) is Literal:
            values.extend(str(arg) for arg in typing.get_args(annotation))
        else:
            pending.extend(typing.get_args(annotation))
    return values


def _env_name(*path: str) -> str:
    prefix = str(Settings.model_config.get("env_prefix", ""))
    delimiter = str(Settings.model_config.get("env_nested_delimiter", "__"))
    return prefix + delimiter.join(part.upper() for part in path)


def _topic_setting(topic: str) -> str | None:
    """The environment variable that overrides a default topic name, if any."""
    for name, field in TopicSettings.model_fields.items():
        if field.default == topic:
            return _env_name("topics", name)
    return None


def _key_schema(topic: str) -> dict[str, Any]:
    """The Kafka key of a topic's records: the conversation id, as UTF-8 bytes."""
    model = EVENT_MODELS[topic]
    _require_fields(model, "conversation_id")
    schema = model.model_json_schema(mode=schema_mode(topic))
    key = {k: v for k, v in schema["properties"]["conversation_id"].items() if k not in ("title", "default")}
    if model.model_fields["conversation_id"].is_required():
        key["description"] = (
            "The event's `conversation_id`, encoded as UTF-8 bytes; it must equal the payload's "
            "`conversation_id`, so every event of a conversation lands in one partition, in order."
        )
    else:
        # Records that may not belong to a valid conversation (the dead letters) keep the key
        # their input had, whatever it was.
        _require_fields(model, "key_b64")
        key["description"] = (
            "The key of the input record, unchanged: normally its conversation id as UTF-8, so "
            "one conversation's dead letters stay in order; no key when the input had none. "
            "A copy is in `key_b64`."
        )
    key["description"] = _prose(key["description"])
    return key


def _channel_notes() -> dict[str, str]:
    """What a user of each default topic needs to know beyond the payload's own description."""
    turn = EVENT_MODELS[TURNS_TOPIC]
    completed = EVENT_MODELS[COMPLETED_TOPIC]
    dead_letter = EVENT_MODELS[DLQ_TOPIC]
    _require_fields(turn, "turn_seq", "compaction")
    _require_fields(completed, "outcome", "version", "compaction_id")
    _require_fields(dead_letter, "reason", "original_b64")
    reasons = ", ".join(f"`{reason.value}`" for reason in DeadLetterReason)
    return {
        TURNS_TOPIC: (
            "Produced by the agent runtime, consumed by the worker pool (one consumer group). "
            "`turn_seq` starts at 1 and grows by one per conversation: a duplicate is a no-op, a "
            "turn ahead of a gap waits for the gap to fill, for `worker.gap_timeout_seconds` at "
            "most (default 300), then goes to the dead-letter topic (`sequence_gap`) while the "
            "conversation keeps waiting for the missing turn. Manual "
            f"(`{CompactionMode.FORCE}`) and reactive (`{CompactionMode.OVERFLOW}`) compaction "
            "requests travel in `compaction`, on this topic, so that they are ordered with the "
            "turns."
        ),
        STARTED_TOPIC: (
            "Published when a compaction begins, before any LLM call; the matching "
            "`compaction.completed` carries the same `compaction_id`."
        ),
        COMPLETED_TOPIC: (
            f"Published when a compaction ends. On `{Outcome.COMPACTED}` the effective history "
            "has a new `version`: re-read it. De-duplicate by (`conversation_id`, `version`) "
            f"when the outcome is `{Outcome.COMPACTED}`, by `compaction_id` otherwise "
            f"(`{Outcome.NOOP}` and `{Outcome.FAILED}` leave the version unchanged)."
        ),
        DLQ_TOPIC: (
            f"Inputs the worker cannot process, with a `reason` ({reasons}), a human-readable "
            "detail and the original key and bytes (base64; an original too big for one record "
            "is cut, and `original_size` tells). To replay, fix the cause and "
            f"produce the original bytes to `{TURNS_TOPIC}` again."
        ),
    }


def _info_description() -> str:
    for model in EVENT_MODELS.values():
        _require_fields(model, "schema_version", "event_id", "timestamp", "conversation_id")
    version = schema_version(EVENT_MODELS[TURNS_TOPIC])
    overrides = ", ".join(
        f"`{setting}`" for topic in EVENT_MODELS if (setting := _topic_setting(topic)) is not None
    )
    return f"""\
Keeps LLM conversations inside their models' context windows. An agent runtime publishes
each turn of each conversation to `{TURNS_TOPIC}`; a pool of stateless workers keeps
the conversation in Redis, compacts its history when it outgrows its budget, and announces
every compaction on `{STARTED_TOPIC}` and `{COMPLETED_TOPIC}`. Inputs it cannot
process go to `{DLQ_TOPIC}`.

Payloads are UTF-8 JSON, one event per record, described by the JSON Schemas next to this
document (generated from the pydantic models in `compaction_worker.contracts.events`). Every event
carries `schema_version` (now {version}), `event_id` (a UUID) and `timestamp` (UTC).
Channel addresses are the default topic names; each can be overridden ({overrides}).

## Ordering

Every record is keyed by its conversation: the Kafka key is `conversation_id` as UTF-8
bytes. One conversation's events therefore land in one partition and are read in the
order they were written, on every topic; different conversations proceed in parallel.
Adding partitions to a live topic moves conversations to other partitions, so drain the
topic first.

## De-duplication

Delivery is at least once. Turns are idempotent by (`conversation_id`, `turn_seq`): a
redelivered or repeated turn changes nothing. Consumers of the output topics drop an
`event_id` they have already seen; because a worker that crashes may announce the same
compaction again under a new `event_id`, `{COMPLETED_TOPIC}` is also de-duplicated by
(`conversation_id`, `version`) when the outcome is `{Outcome.COMPACTED}`.

## Dead letters

Bad input (malformed JSON, a schema violation, an oversized record, a sequence gap that
never fills, ...) never stops the worker and never touches stored state: it is published
to `{DLQ_TOPIC}` with the reason and the original bytes, and the worker moves on.
"""


def _server() -> dict[str, Any]:
    protocols = ", ".join(_literal_values(KafkaSettings, "security_protocol"))
    mechanisms = ", ".join(_literal_values(KafkaSettings, "sasl_mechanism"))
    return {
        "host": "{bootstrap}",
        "protocol": "kafka",
        "title": "Kafka cluster",
        "description": _prose(
            f"The Kafka cluster the worker pool consumes from and publishes to. Security "
            f"protocols: {protocols}; SASL mechanisms: {mechanisms} "
            f"(`{_env_name('kafka', 'security_protocol')}` and the other "
            f"`{_env_name('kafka', '')}*` settings)."
        ),
        "variables": {
            "bootstrap": {
                "default": "localhost:9092",
                "description": _prose(
                    f"`host:port` of one or more bootstrap brokers, comma-separated "
                    f"(`{_env_name('kafka', 'bootstrap_servers')}`)."
                ),
            }
        },
    }


def asyncapi_document() -> dict[str, Any]:
    """The AsyncAPI 3.0 document of the worker: its server, channels, operations and messages."""
    notes = _channel_notes()
    group_id = KafkaSettings.model_fields["group_id"].default
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    schemas: dict[str, Any] = {}
    for topic, model in EVENT_MODELS.items():
        channel_id = _camel(topic)
        name = model.__name__
        receives = topic in INPUT_TOPICS
        summary = _summary(model)
        override = _topic_setting(topic)
        description = " ".join(
            part
            for part in (
                notes.get(topic, ""),
                f"Overridden with `{override}`." if override else "",
            )
            if part
        )

        schemas[name] = {"$ref": f"./{schema_file(topic)}"}
        message: dict[str, Any] = {
            "name": name,
            "title": topic,
            "summary": summary,
            "contentType": "application/json",
            "payload": {"$ref": f"#/components/schemas/{name}"},
        }
        if "compaction_id" in model.model_fields:
            message["correlationId"] = {
                "description": "Pairs a compaction's started and completed events.",
                "location": "$message.payload#/compaction_id",
            }
        message["bindings"] = {"kafka": {"key": _key_schema(topic), "bindingVersion": KAFKA_BINDING_VERSION}}
        messages[name] = message

        channels[channel_id] = {
            "address": topic,
            "title": topic,
            "summary": summary,
            "description": _prose(description),
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
        }

        operation_id = ("receive" if receives else "send") + channel_id[:1].upper() + channel_id[1:]
        operation: dict[str, Any] = {
            "action": "receive" if receives else "send",
            "channel": {"$ref": f"#/channels/{channel_id}"},
            "summary": (
                f"The worker pool consumes `{topic}`."
                if receives
                else f"The worker pool publishes `{topic}`."
            ),
            "messages": [{"$ref": f"#/channels/{channel_id}/messages/{name}"}],
        }
        if receives:
            operation["bindings"] = {
                "kafka": {
                    "groupId": {
                        "type": "string",
                        "default": group_id,
                        "description": f"`{_env_name('kafka', 'group_id')}`; all workers share it.",
                    },
                    "bindingVersion": KAFKA_BINDING_VERSION,
                }
            }
        operations[operation_id] = operation

    return {
        "asyncapi": ASYNCAPI_VERSION,
        "info": {
            "title": "compaction-worker",
            "version": __version__,
            "description": _prose(_info_description()),
        },
        "defaultContentType": "application/json",
        "servers": {"kafka": _server()},
        "channels": channels,
        "operations": operations,
        "components": {"schemas": schemas, "messages": messages},
    }


class _Dumper(yaml.SafeDumper):
    """A YAML dumper that writes multi-line strings as literal blocks, for readable prose."""

    def ignore_aliases(self, data: Any) -> bool:
        # A dict that appears twice is written twice: no &id001 anchors in a published file.
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _represent_str)


def render_yaml(document: dict[str, Any]) -> str:
    """The AsyncAPI document as the file's exact text."""
    # Insertion order, not sorted keys: an AsyncAPI document reads top-down (info, servers,
    # channels, operations, components), and the order is fixed by the code, so still stable.
    body = yaml.dump(
        document,
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
    return f"# {GENERATED_NOTE}\n{body}"
