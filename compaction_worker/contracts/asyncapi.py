"""The words of the AsyncAPI document: what each topic, key and header means, from the event models.

FastStream generates the document from the worker's own publishers and subscriber
(``runtime/channels.py``); this module writes what those declarations carry as text
(the descriptions) and what FastStream's message object has no field for (the Kafka key and
the headers). The names a deployment sets (topics, the variables that rename them) are
passed in, so that the contract layer knows nothing of the settings. A field the text names
that the models lose fails generation (:class:`SpecificationError`).
"""

from __future__ import annotations

import textwrap
from collections.abc import Mapping
from typing import Any

import yaml
from pydantic import BaseModel

from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    EVENT_MODELS,
    PROPOSED_TOPIC,
    SCHEMA_VERSION,
    STARTED_TOPIC,
    TURNS_TOPIC,
    CompactionMode,
    DeadLetterReason,
    Outcome,
)
from compaction_worker.contracts.json_schemas import GENERATED_NOTE, schema_mode
from compaction_worker.errors import CompactionWorkerError

KAFKA_BINDING_VERSION = "0.4.0"
"""The Kafka bindings version of FastStream's channel bindings, so that the document uses one."""


class SpecificationError(CompactionWorkerError):
    """The models no longer carry a field that the published contract describes."""


def prose(text: str, width: int = 88) -> str:
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
    # The prose names these fields; a renamed field must fail generation, not go stale.
    missing = [name for name in names if name not in model.model_fields]
    if missing:
        raise SpecificationError(
            f"{model.__name__} lacks {', '.join(missing)}, which the AsyncAPI document describes"
        )


def key_schema(topic: str) -> dict[str, Any]:
    """The Kafka key of a topic's records (``topic`` a default name): the conversation id, as UTF-8 bytes."""
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
    key["description"] = prose(key["description"])
    return key


HEADERS: dict[str, Any] = {
    "type": "object",
    "description": "Optional W3C trace context (the info's Headers section says where it travels).",
    "properties": {
        "traceparent": {
            "type": "string",
            "description": "W3C `traceparent`: version-traceid-parentid-flags.",
        },
        "tracestate": {"type": "string", "description": "W3C `tracestate`: vendor-specific trace data."},
    },
}
"""The headers every record may carry (they are the same on every topic)."""


def channel_description(topic: str, renamed_by: str | None, group_id: str | None = None) -> str:
    """What a user of one topic (``topic`` a default name) needs to know beyond the payload's description.

    ``renamed_by`` is the setting that renames the topic; ``group_id`` the consumer group
    that reads it, for the input.
    """
    _require_fields(EVENT_MODELS[TURNS_TOPIC], "turn_seq", "compaction")
    _require_fields(EVENT_MODELS[COMPLETED_TOPIC], "outcome", "version", "compaction_id")
    _require_fields(EVENT_MODELS[DLQ_TOPIC], "reason", "original_b64")
    reasons = ", ".join(f"`{reason.value}`" for reason in DeadLetterReason)
    group = f" (consumer group `{group_id}`)" if group_id else " (one consumer group)"
    notes = {
        TURNS_TOPIC: (
            f"Produced by the agent runtime, consumed by the worker pool{group}. "
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
            f"Published when a compaction ends. On `{Outcome.COMPACTED}` (and a rewind's "
            f"`{Outcome.REWOUND}`) the effective history has a new `version`: re-read it. "
            "De-duplicate by (`conversation_id`, `version`) when the outcome is "
            f"`{Outcome.COMPACTED}` or `{Outcome.REWOUND}`, by `compaction_id` otherwise "
            f"(`{Outcome.NOOP}`, `{Outcome.FAILED}` and `{Outcome.DISCARDED}` leave the version unchanged)."
        ),
        PROPOSED_TOPIC: (
            "Published instead of a commit when a conversation's settings say `pipeline.approval: "
            "manual`: the compaction computed and not applied. Apply it (`Client.apply`) or discard "
            f"it (`Client.discard`); its `{COMPLETED_TOPIC}` (same `compaction_id`) says which. A "
            "reactive compaction, after an overflow, never waits for approval."
        ),
        DLQ_TOPIC: (
            f"Inputs the worker cannot process, with a `reason` ({reasons}), a human-readable "
            "detail and the original key and bytes (base64; an original too big for one record "
            "is cut, and `original_size` tells). To replay, fix the cause and "
            f"produce the original bytes to `{TURNS_TOPIC}` again."
        ),
    }
    parts = [notes[topic]]
    if renamed_by:
        parts.append(f"The address is the default name, renamed by `{renamed_by}`.")
    return prose(" ".join(parts))


def info_description(renamed_by: Mapping[str, str]) -> str:
    """The document's introduction; ``renamed_by`` names, per default topic, the setting that renames it."""
    for model in EVENT_MODELS.values():
        _require_fields(model, "schema_version", "event_id", "timestamp", "conversation_id")
    overrides = ", ".join(f"`{renamed_by[topic]}`" for topic in EVENT_MODELS if topic in renamed_by)
    return prose(f"""\
Keeps LLM conversations inside their models' context windows. An agent runtime publishes
each turn of each conversation to `{TURNS_TOPIC}`; a pool of stateless workers keeps
the conversation in Redis, compacts its history when it outgrows its budget, and announces
every compaction on `{STARTED_TOPIC}` and `{COMPLETED_TOPIC}`. Inputs it cannot
process go to `{DLQ_TOPIC}`.

Payloads are UTF-8 JSON, one event per record. The JSON Schemas next to this document
(generated from the pydantic models in `compaction_worker.contracts.events`) are exact for
each direction: what the worker accepts, and every field it always writes. Every event
carries `schema_version` (now {SCHEMA_VERSION}), `event_id` (a UUID) and `timestamp` (UTC).
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
(`conversation_id`, `version`) when the outcome is `{Outcome.COMPACTED}` or `{Outcome.REWOUND}`.

## Dead letters

Bad input (malformed JSON, a schema violation, an oversized record, a sequence gap that
never fills, ...) and a turn whose handling keeps failing for another reason than an outage
of Redis or the broker never stop the worker and never touch stored state: they are
published to `{DLQ_TOPIC}` with the reason and the original bytes, and the worker moves on.
When the event names its conversation and `turn_seq`, the rejection is also recorded beside the
conversation, for the runtime that published it: `Client.wait_for(receipt)` raises `TurnRejected`
with the same reason and detail. The topic stays the operator's record.

## Headers

`traceparent` and `tracestate` (W3C trace context) are optional on every topic. A turn that
carries them has its processing, the compactions it causes and their events in the same
trace; the worker writes them on its events when tracing is configured. FastStream also
writes a `correlation_id` header (a UUID per record) on the events the worker publishes.
""")


class _Dumper(yaml.SafeDumper):
    """A YAML dumper that writes multi-line strings as literal blocks, for readable prose."""

    def ignore_aliases(self, data: Any) -> bool:
        # A dict that appears twice is written twice: no &id001 anchors in a published file.
        return True


def _represent_str(dumper: yaml.SafeDumper, data: str) -> yaml.ScalarNode:
    return dumper.represent_scalar("tag:yaml.org,2002:str", data, style="|" if "\n" in data else None)


_Dumper.add_representer(str, _represent_str)


def render_yaml(document: Mapping[str, Any]) -> str:
    """The AsyncAPI document as the file's exact text."""
    # Insertion order, not sorted keys: an AsyncAPI document reads top-down (info, servers,
    # channels, operations, components), and FastStream's order is fixed, so still stable.
    body = yaml.dump(
        dict(document),
        Dumper=_Dumper,
        sort_keys=False,
        allow_unicode=True,
        width=100,
        default_flow_style=False,
    )
    return f"# {GENERATED_NOTE}\n{body}"
