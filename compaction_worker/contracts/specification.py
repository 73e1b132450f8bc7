"""The published contracts, generated from the event models: JSON Schemas and an AsyncAPI document.

Everything here derives from :data:`compaction_worker.contracts.events.EVENT_MODELS`, the topic
names in :mod:`compaction_worker.state.keys` and the settings defaults, so the files in
``schemas/`` cannot say something the code does not do. :func:`render_all` is pure and
deterministic (same models, byte-identical text); :func:`write` and :func:`check` are
what ``compaction-worker schemas [--check]`` calls.
"""

from __future__ import annotations

import json
import re
import textwrap
import typing
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel

from compaction_worker import __version__
from compaction_worker.contracts.events import EVENT_MODELS, CompactionMode, Outcome
from compaction_worker.errors import CompactionWorkerError, DeadLetterReason
from compaction_worker.settings import KafkaSettings, Settings, TopicSettings
from compaction_worker.state import keys

DEFAULT_DIRECTORY = Path("schemas")
"""Where the committed contracts live, relative to the repository root."""

ASYNCAPI_FILE = "asyncapi.yaml"
JSON_SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
ASYNCAPI_VERSION = "3.0.0"
KAFKA_BINDING_VERSION = "0.5.0"  # the Kafka bindings version that goes with AsyncAPI 3.0

INPUT_TOPICS = frozenset({keys.TURNS_TOPIC})
"""Topics the worker consumes; every other topic in ``EVENT_MODELS`` is one it publishes."""

GENERATED_NOTE = (
    "Generated from compaction_worker/contracts/events.py by `compaction-worker schemas`; do not edit."
)
"""Marks a file as ours: :func:`check` reports and :func:`write` removes stale files carrying it."""

_GENERATED_SUFFIXES = (".json", ".yaml", ".yml")

SchemaMode = Literal["validation", "serialization"]


class SpecificationError(CompactionWorkerError):
    """The models no longer carry a field that the published contract describes."""


# --- JSON Schemas -----------------------------------------------------------------------


def schema_file(topic: str) -> str:
    """The file name of one topic's JSON Schema."""
    return f"{topic}.json"


def schema_mode(topic: str) -> SchemaMode:
    """Validation mode for what the worker accepts, serialization mode for what it emits.

    A producer of an input may leave out every field that has a default, and that is what
    the validation-mode schema says; an output is described as the bytes the worker writes
    (after serializers, computed fields and serialization aliases), which is what consumers
    see, and that is what the serialization-mode schema says.
    """
    return "validation" if topic in INPUT_TOPICS else "serialization"


def schema_id(topic: str) -> str:
    """The ``$id`` of one topic's schema: a URN that names the topic and the schema version."""
    version = _schema_version(EVENT_MODELS[topic])
    return f"urn:compaction-worker:schema:{topic}" + (f":v{version}" if version is not None else "")


def event_schema(topic: str) -> dict[str, Any]:
    """The JSON Schema (draft 2020-12) of one topic's event, from its pydantic model."""
    model = EVENT_MODELS[topic]
    schema = model.model_json_schema(mode=schema_mode(topic))
    direction = "consumes" if topic in INPUT_TOPICS else "publishes"
    return {
        "$schema": JSON_SCHEMA_DIALECT,
        "$id": schema_id(topic),
        "$comment": GENERATED_NOTE,
        **schema,
        "title": schema.get("title", model.__name__),
        "description": schema.get("description")
        or f"An event on `{topic}`, which compaction-worker {direction}.",
    }


def _render_json(document: dict[str, Any]) -> str:
    # Sorted keys and a fixed indent keep the diff of a model change down to that change.
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


# --- AsyncAPI ---------------------------------------------------------------------------


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


def _schema_version(model: type[BaseModel]) -> Any:
    field = model.model_fields.get("schema_version")
    return None if field is None else field.default


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
    turn = EVENT_MODELS[keys.TURNS_TOPIC]
    completed = EVENT_MODELS[keys.COMPLETED_TOPIC]
    dead_letter = EVENT_MODELS[keys.DLQ_TOPIC]
    _require_fields(turn, "turn_seq", "compaction")
    _require_fields(completed, "outcome", "version", "compaction_id")
    _require_fields(dead_letter, "reason", "original_b64")
    reasons = ", ".join(f"`{reason.value}`" for reason in DeadLetterReason)
    return {
        keys.TURNS_TOPIC: (
            "Produced by the agent runtime, consumed by the worker pool (one consumer group). "
            "`turn_seq` starts at 1 and grows by one per conversation: a duplicate is a no-op, a "
            "turn ahead of a gap waits for the gap to fill, for `worker.gap_timeout_seconds` at "
            "most (default 300), then goes to the dead-letter topic (`sequence_gap`) while the "
            "conversation keeps waiting for the missing turn. Manual "
            f"(`{CompactionMode.FORCE}`) and reactive (`{CompactionMode.OVERFLOW}`) compaction "
            "requests travel in `compaction`, on this topic, so that they are ordered with the "
            "turns."
        ),
        keys.STARTED_TOPIC: (
            "Published when a compaction begins, before any LLM call; the matching "
            "`compaction.completed` carries the same `compaction_id`."
        ),
        keys.COMPLETED_TOPIC: (
            f"Published when a compaction ends. On `{Outcome.COMPACTED}` the effective history "
            "has a new `version`: re-read it. De-duplicate by (`conversation_id`, `version`) "
            f"when the outcome is `{Outcome.COMPACTED}`, by `compaction_id` otherwise "
            f"(`{Outcome.NOOP}` and `{Outcome.FAILED}` leave the version unchanged)."
        ),
        keys.DLQ_TOPIC: (
            f"Inputs the worker cannot process, with a `reason` ({reasons}), a human-readable "
            "detail and the original key and bytes (base64; an original too big for one record "
            "is cut, and `original_size` tells). To replay, fix the cause and "
            f"produce the original bytes to `{keys.TURNS_TOPIC}` again."
        ),
    }


def _info_description() -> str:
    for model in EVENT_MODELS.values():
        _require_fields(model, "schema_version", "event_id", "timestamp", "conversation_id")
    version = _schema_version(EVENT_MODELS[keys.TURNS_TOPIC])
    overrides = ", ".join(
        f"`{setting}`" for topic in EVENT_MODELS if (setting := _topic_setting(topic)) is not None
    )
    return f"""\
Keeps LLM conversations inside their models' context windows. An agent runtime publishes
each turn of each conversation to `{keys.TURNS_TOPIC}`; a pool of stateless workers keeps
the conversation in Redis, compacts its history when it outgrows its budget, and announces
every compaction on `{keys.STARTED_TOPIC}` and `{keys.COMPLETED_TOPIC}`. Inputs it cannot
process go to `{keys.DLQ_TOPIC}`.

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
compaction again under a new `event_id`, `{keys.COMPLETED_TOPIC}` is also de-duplicated by
(`conversation_id`, `version`) when the outcome is `{Outcome.COMPACTED}`.

## Dead letters

Bad input (malformed JSON, a schema violation, an oversized record, a sequence gap that
never fills, ...) never stops the worker and never touches stored state: it is published
to `{keys.DLQ_TOPIC}` with the reason and the original bytes, and the worker moves on.
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


def _render_yaml(document: dict[str, Any]) -> str:
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


# --- files ------------------------------------------------------------------------------


def render_all() -> dict[str, str]:
    """Every contract file, as relative file name -> exact text (UTF-8, LF, trailing newline)."""
    files = {schema_file(topic): _render_json(event_schema(topic)) for topic in EVENT_MODELS}
    files[ASYNCAPI_FILE] = _render_yaml(asyncapi_document())
    return dict(sorted(files.items()))


def write(directory: Path) -> list[Path]:
    """Bring ``directory`` up to date and return the files written; up-to-date ones stay untouched.

    Stale files that this module generated earlier (an event that no longer exists) are
    removed; files it did not generate are never touched.
    """
    expected = render_all()
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, text in expected.items():
        path = directory / name
        data = text.encode("utf-8")
        # Bytes, not text mode, so that no platform turns the newlines into something else.
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            written.append(path)
    for stale in _stale_files(directory, expected):
        stale.unlink()
    return written


def check(directory: Path) -> list[str]:
    """Describe how ``directory`` differs from the models: missing, different or extra files."""
    expected = render_all()
    problems: list[str] = []
    for name, text in expected.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        actual = path.read_bytes().decode("utf-8", errors="replace")
        if actual != text:
            problems.append(f"{path}: differs from the models ({_first_difference(actual, text)})")
    problems.extend(
        f"{path}: extra, no event model produces it" for path in _stale_files(directory, expected)
    )
    return problems


def _stale_files(directory: Path, expected: dict[str, str]) -> list[Path]:
    if not directory.is_dir():
        return []
    return [
        path
        for path in sorted(directory.iterdir())
        if path.is_file()
        and path.name not in expected
        and path.suffix in _GENERATED_SUFFIXES
        and GENERATED_NOTE in path.read_bytes()[:4096].decode("utf-8", errors="replace")
    ]


def _first_difference(actual: str, expected: str) -> str:
    actual_lines, expected_lines = actual.splitlines(), expected.splitlines()
    for number, (found, wanted) in enumerate(zip(actual_lines, expected_lines, strict=False), 1):
        if found != wanted:
            return f"line {number}: expected {_clip(wanted)}, found {_clip(found)}"
    if len(actual_lines) != len(expected_lines):
        return f"{len(expected_lines)} lines expected, {len(actual_lines)} found"
    return "line endings or trailing newline differ"


def _clip(line: str, width: int = 60) -> str:
    line = line.strip()
    return repr(line if len(line) <= width else line[: width - 1] + "…")
