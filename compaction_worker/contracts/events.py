"""The event contracts: pydantic v2 models are the source of truth for every topic.

``schemas/`` holds the JSON Schemas generated from these models; ``compaction-worker
schemas --check`` (and a test) fails when they drift.
"""

from __future__ import annotations

import hashlib
import uuid
from collections.abc import Sequence
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Final, Literal, Protocol

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, model_validator

from compaction_worker.errors import CompactionWorkerError

SCHEMA_VERSION: Final = 1

# The default topic names; the settings may rename each.
TURNS_TOPIC: Final = "conversation.turn"
STARTED_TOPIC: Final = "compaction.started"
COMPLETED_TOPIC: Final = "compaction.completed"
PROPOSED_TOPIC: Final = "compaction.proposed"
DLQ_TOPIC: Final = "conversation.turn.dlq"


class Publish(Protocol):
    """Sends one event to a topic, keyed: the worker's broker, or a test double (every publishing part takes one)."""

    async def __call__(self, topic: str, payload: bytes, key: bytes | None) -> None: ...


MAX_INSTRUCTIONS_CHARS: Final = 4_000
"""The longest compaction instructions a request or a conversation may carry (characters)."""

ConversationId = Annotated[
    str,
    Field(
        min_length=1,
        max_length=256,
        pattern=r"^[^\x00-\x1f\x7f{}]+$",
        description="Opaque id of one conversation; also the Kafka key (UTF-8 bytes).",
    ),
]


_PUBLISHED = ConfigDict(
    extra="ignore",
    json_schema_serialization_defaults_required=True,
    json_schema_mode_override="serialization",
)
"""The config of what the worker publishes: its schema is of the bytes written, defaults included."""


def _now() -> datetime:
    return datetime.now(UTC)


class _Event(BaseModel):
    """Fields every event carries.

    Unknown fields are ignored rather than rejected, so that adding a field is not a
    breaking change for older workers or consumers; breaking changes bump schema_version.
    """

    model_config = _PUBLISHED

    schema_version: Literal[1] = SCHEMA_VERSION
    event_id: uuid.UUID = Field(default_factory=uuid.uuid4, description="Unique id, for de-duplication.")
    timestamp: AwareDatetime = Field(
        default_factory=_now, description="When the event was produced (with a timezone)."
    )

    def wire(self) -> bytes:
        """The event as it is published: its JSON."""
        return self.model_dump_json().encode()


# --- messages -------------------------------------------------------------------------


class FunctionCall(BaseModel):
    """The function an assistant asks to call, with JSON-encoded arguments."""

    model_config = ConfigDict(extra="allow")

    name: str = Field(min_length=1)
    arguments: str = ""


class ToolCall(BaseModel):
    """One tool call of an assistant message (OpenAI shape)."""

    model_config = ConfigDict(extra="allow")

    id: str = Field(min_length=1)
    type: Literal["function"] = "function"
    function: FunctionCall


class ContentPart(BaseModel):
    """One part of a multi-part content: ``text``, ``image_url``, or another provider type."""

    model_config = ConfigDict(extra="allow")

    type: str = Field(min_length=1)
    text: str | None = None
    image_url: dict[str, Any] | str | None = None

    @model_validator(mode="after")
    def _text_has_text(self) -> ContentPart:
        if self.type == "text" and self.text is None:
            raise ValueError("a text part needs 'text'")
        if self.type == "image_url" and self.image_url is None:
            raise ValueError("an image_url part needs 'image_url'")
        return self


class ChatMessage(BaseModel):
    """An OpenAI-style chat message; unknown provider fields are kept as they are."""

    model_config = ConfigDict(extra="allow")

    role: Literal["system", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None
    pinned: bool = Field(default=False, description="Never summarized or pruned away.")
    task: bool | None = Field(
        default=None,
        description="The statement of the work (kept verbatim within the task's budget); without a mark, the "
        "first user message that is no demonstration.",
    )

    @model_validator(mode="after")
    def _role_rules(self) -> ChatMessage:
        if self.role == "tool" and not self.tool_call_id:
            raise ValueError("a tool message needs tool_call_id")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError("only tool messages carry tool_call_id")
        if self.tool_calls and self.role != "assistant":
            raise ValueError("only assistant messages carry tool_calls")
        if self.role in ("user", "system") and self.content is None:
            raise ValueError(f"a {self.role} message needs content")
        if self.role == "assistant" and self.content is None and not self.tool_calls:
            raise ValueError("an assistant message needs content or tool_calls")
        return self

    def to_dict(self) -> dict[str, Any]:
        """The message as plain JSON-ready data, without unset optional fields."""
        return self.model_dump(mode="json", exclude_none=True, exclude_defaults=False)

    def to_json(self) -> str:
        """:meth:`to_dict` as compact JSON text, non-ASCII kept as is (what the stores keep)."""
        return self.model_dump_json(exclude_none=True)


# --- conversation.turn ----------------------------------------------------------------


class Usage(BaseModel):
    """Provider-reported token usage of the runtime's last model call."""

    model_config = ConfigDict(extra="allow")

    prompt_tokens: int = Field(ge=0)
    completion_tokens: int | None = Field(default=None, ge=0)
    total_tokens: int | None = Field(default=None, ge=0)


class CompactionMode(StrEnum):
    """How a turn asks for a compaction besides the threshold."""

    FORCE = "force"
    OVERFLOW = "overflow"


class MessageRef(BaseModel):
    """An earlier message of the conversation: every message of turn ``turn_seq``, or its ``index``-th."""

    model_config = ConfigDict(extra="forbid")

    turn_seq: int = Field(ge=1)
    index: int | None = Field(
        default=None, ge=0, description="The message's place in its turn, from 0; absent: all."
    )


class CompactionRequest(BaseModel):
    """A manual (``force``) or reactive (``overflow``) compaction request."""

    model_config = ConfigDict(extra="forbid")

    mode: CompactionMode
    error: str | None = Field(default=None, max_length=20_000, description="The provider's error text.")
    instructions: str | None = Field(
        default=None,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="What this compaction's summary should keep first (e.g. \"keep the migration plan and "
        "every failing test name\"); added to the conversation's standing instructions.",
    )

    @model_validator(mode="after")
    def _overflow_has_error(self) -> CompactionRequest:
        if self.mode is CompactionMode.OVERFLOW and not self.error:
            raise ValueError("an overflow request carries the provider's error text")
        return self


class TurnEvent(_Event):
    """``conversation.turn``: one turn of one conversation (the messages it adds)."""

    model_config = ConfigDict(json_schema_mode_override="validation")  # an input: what it may omit

    conversation_id: ConversationId
    turn_seq: int = Field(ge=1, description="Strictly increasing per conversation, from 1.")
    model: str = Field(min_length=1, max_length=256, description="LiteLLM model string.")
    messages: list[ChatMessage] = Field(default_factory=list, max_length=10_000)
    system_prompt: str | None = None
    tools: list[dict[str, Any]] | None = None
    context_window: int | None = Field(default=None, ge=256)
    max_output_tokens: int | None = Field(default=None, ge=1)
    usage: Usage | None = None
    compaction: CompactionRequest | None = None
    compaction_instructions: str | None = Field(
        default=None,
        max_length=MAX_INSTRUCTIONS_CHARS,
        description="Standing instructions for every later compaction of the conversation (what its "
        "summaries keep first), until changed; an empty string clears them, absent leaves them as they are.",
    )

    profile: str | None = Field(
        default=None,
        max_length=64,
        pattern=r"^([A-Za-z0-9][A-Za-z0-9_.-]*)?$",
        description="The settings profile (the deployment's `profiles`) the conversation compacts under from "
        "this turn on: its threshold, target, tail, budgets, summarizer and approval; an empty string returns it "
        "to the deployment's settings, absent leaves it as it is. A name the deployment does not have is "
        "dead-lettered (unknown_profile).",
    )

    pin: list[MessageRef] | None = Field(
        default=None,
        max_length=100,
        description="Earlier messages to pin after the fact (as Client.pin): every later compaction keeps them "
        "verbatim. Applied once the turn is stored, or by the next compaction if one is running; a message a "
        "summary already replaced cannot be pinned (logged).",
    )
    unpin: list[MessageRef] | None = Field(
        default=None, max_length=100, description="Earlier messages to unpin."
    )

    @model_validator(mode="after")
    def _has_something(self) -> TurnEvent:
        if (
            not self.messages
            and self.compaction is None
            and self.system_prompt is None
            and self.compaction_instructions is None
            and self.profile is None
            and not self.pin
            and not self.unpin
        ):
            raise ValueError(
                "a turn needs messages, a system_prompt, compaction_instructions, a profile, pins or a "
                "compaction request"
            )
        return self

    def fingerprint(self, messages: Sequence[str] | None = None) -> str:
        """32 hex digits of the turn's content, equal for every delivery of one turn; ``messages``:
        its messages' ``to_json`` texts, if at hand (made once per turn for the stores).

        The per-turn script stores it with the turn and compares it on a redelivery: the same seq
        with another fingerprint is a conflicting duplicate. The event's identity (id, timestamp,
        schema version) is left out, so a runtime that publishes a turn again under a new id sends
        the same turn; fields at their defaults are left out too, so a field added to the event later
        keeps stored turns' fingerprints. It hashes the other fields' JSON, then each message's.
        """
        texts = messages if messages is not None else [m.to_json() for m in self.messages]
        digest = hashlib.blake2b(
            self.model_dump_json(exclude=_NOT_FINGERPRINTED, exclude_defaults=True).encode(), digest_size=16
        )
        for text in texts:
            digest.update(b"\x1e")
            digest.update(text.encode())
        return digest.hexdigest()


_NOT_FINGERPRINTED = {"event_id", "timestamp", "schema_version", "messages"}
"""What :meth:`TurnEvent.fingerprint` leaves out (a set, as pydantic's exclude takes it: built once)."""


# --- compaction.started / compaction.completed ------------------------------------------


class Trigger(StrEnum):
    """Why a compaction ran (``rewind``: an operator restored the history from before one)."""

    THRESHOLD = "threshold"
    SOFT_THRESHOLD = "soft_threshold"
    MANUAL = "manual"
    REACTIVE = "reactive"
    REWIND = "rewind"


class Outcome(StrEnum):
    """How a compaction ended."""

    COMPACTED = "compacted"
    NOOP = "noop"
    FAILED = "failed"
    DISCARDED = "discarded"
    """A proposal (``pipeline.approval: manual``) that was not applied: discarded by the runtime,
    replaced by a newer one, or made moot by a reactive compaction; the version is unchanged."""
    REWOUND = "rewound"
    """A rewind (trigger ``rewind``) committed: the history from before a compaction, restored verbatim
    from the transcript as a new version."""


class ContextStatus(StrEnum):
    """Whether the model sees the whole conversation, or a reduced history.

    ``summarized`` whenever anything the model saw was replaced: turns covered by a summary
    (or the sliding window's marker), or messages pruned, de-duplicated or truncated.
    """

    FULL = "full"
    SUMMARIZED = "summarized"


class StandingStateReport(BaseModel):
    """What a compaction did with the standing state: the user's rules, constraints, preferences, goals,
    decisions and facts, by kind. Kept: the sentence is in the new effective history word for word."""

    model_config = _PUBLISHED

    kept: dict[str, int] = Field(
        default_factory=dict, description="Current items still in the history, by kind."
    )
    let_go: dict[str, int] = Field(
        default_factory=dict,
        description="Current items the history no longer says, by kind (space ran out; the transcript keeps them).",
    )
    superseded: int = Field(
        default=0, ge=0, description="Items a later message changed (shown as no longer current)."
    )


class LlmUsage(BaseModel):
    """Tokens and cost of the summarizer's LLM calls in one compaction."""

    model_config = _PUBLISHED

    calls: int = Field(default=0, ge=0)
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    total_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0)


class CompactionCost(BaseModel):
    """What a compaction costs once and saves per later call at the conversation model's prices
    (LiteLLM's), with the provider's prompt cache counted; null figures: the model is unpriced."""

    model_config = _PUBLISHED

    tokens_removed: int = Field(default=0, ge=0, description="tokens_before - tokens_after.")
    cache_write_tokens: int = Field(
        default=0,
        ge=0,
        description="Tokens of the new history after the leading messages it shares with the old one: the next "
        "call sends them uncached (a cache write where the provider bills one).",
    )
    cache_write_cost: float | None = Field(
        default=None, ge=0, description="What the next call pays for them beyond cache reads, in dollars."
    )
    saving_per_call: float | None = Field(
        default=None,
        ge=0,
        description="What each later call no longer pays: the tokens removed at the cache-read price, in dollars.",
    )
    break_even_calls: float | None = Field(
        default=None,
        ge=0,
        description="Later calls until the savings have paid the cache write and the summary calls "
        "(llm_usage.cost_usd); null when unpriced or nothing was removed.",
    )


class CompactionStarted(_Event):
    """``compaction.started``: a compaction has begun (before any LLM call)."""

    conversation_id: ConversationId
    compaction_id: uuid.UUID
    trigger: Trigger
    model: str = Field(min_length=1)
    tokens_before: int = Field(ge=0)
    window: int = Field(ge=0)
    threshold: int = Field(ge=0)
    target: int = Field(ge=0)
    version: int = Field(ge=0, description="Effective-history version the compaction starts from.")


class CompactionCompleted(_Event):
    """``compaction.completed``: how a compaction ended; de-duplicate by conversation and version.

    A rewind (trigger ``rewind``) reports ``rewound``: it commits a new version too, whose history
    is the larger one from before the compaction it undoes.
    """

    conversation_id: ConversationId
    compaction_id: uuid.UUID
    trigger: Trigger
    outcome: Outcome
    stages: list[str] = Field(default_factory=list)
    stage_savings: dict[str, int] = Field(
        default_factory=dict,
        description="Tokens each stage saved, by stage name (in the units of tokens_before).",
    )
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    messages_before: int = Field(ge=0)
    messages_after: int = Field(ge=0)
    summary_tokens: int = Field(default=0, ge=0)
    summarizer_model: str | None = None
    llm_usage: LlmUsage = Field(default_factory=LlmUsage)
    window: int = Field(ge=0)
    target: int = Field(ge=0)
    version: int = Field(ge=0, description="Effective-history version after this compaction.")
    context_status: ContextStatus
    duration_ms: int = Field(ge=0)
    error: str | None = None
    circuit_open: bool = Field(
        default=False,
        description="The summarizer's model was skipped: it kept failing, for any conversation (the fallback ran).",
    )
    llm_failures: int = Field(
        default=0,
        ge=0,
        description="Failed LLM runs in a row on the summarizer's model, by any conversation, after this one (0 after a success).",
    )
    artifacts_dropped: int = Field(
        default=0,
        ge=0,
        description="Artifacts (paths, commands, errors, ids, names, stated facts, distinctive terms) of what "
        "this compaction replaced that the history carried verbatim before it and no longer does, one per "
        "identifier: what it let go, so that a conversation's events sum to what its history lost. All of "
        "them stay retrievable (`compaction-worker artifacts` lists every archived one and whether the "
        "history still carries it).",
    )
    summary_items_refused: int = Field(
        default=0,
        ge=0,
        description="Items of the model's summary that the turns it summarized do not support (an identifier "
        "or number they never say): dropped before the commit, so no such item enters the history.",
    )
    summary_items_let_go: int = Field(
        default=0,
        ge=0,
        description="Items of the summary that did not fit its budget, the oldest resolved first: dropped "
        "(their turns stay in the transcript, which recall searches).",
    )
    standing_state: StandingStateReport | None = Field(
        default=None,
        description="The user's standing rules, constraints, preferences, goals, decisions and facts: how many "
        "the compacted history keeps and lets go, by kind; null when none was stated or nothing was committed.",
    )
    notes: list[str] = Field(
        default_factory=list,
        description="What a person should know about how the compaction went, in words (e.g. the verbatim "
        "tail could not start on a user turn).",
    )
    instructions: str | None = Field(
        default=None,
        description="The instructions this compaction applied: the conversation's standing ones, then the "
        "request's, separated by a blank line; null when none.",
    )
    cost: CompactionCost | None = Field(
        default=None, description="A commit's cost, saving per later call and break-even; null otherwise."
    )
    summary: str | None = Field(
        default=None,
        description="The summary the effective history now starts with (every summary chunk, as the summary "
        "turn holds them), when the worker is set to send it (topics.completed_summary); null otherwise, and "
        "when the history holds no summary.",
    )


# --- conversation.turn.dlq --------------------------------------------------------------


class DeadLetterReason(StrEnum):
    """Why an input event went to the dead-letter topic instead of the store."""

    MALFORMED_JSON = "malformed_json"
    SCHEMA_VIOLATION = "schema_violation"
    OVERSIZED = "oversized"
    KEY_MISMATCH = "key_mismatch"
    UNKNOWN_MODEL = "unknown_model"
    UNKNOWN_PROFILE = "unknown_profile"
    """The turn names a settings profile the deployment does not have."""
    SEQUENCE_GAP = "sequence_gap"
    CONFLICTING_DUPLICATE = "conflicting_duplicate"
    PROCESSING_FAILED = "processing_failed"
    """Handling the turn failed ``retry.turn_attempts`` times with an error that is no outage."""


def validation_summary(error: ValidationError, limit: int = 10) -> str:
    """Why pydantic refused an event, for a person: each field's place and message (``limit`` of them)."""
    parts = [
        f"{'.'.join(str(p) for p in item['loc']) or 'event'}: {item['msg']}"
        for item in error.errors()[:limit]
    ]
    more = error.error_count() - limit
    return "; ".join(parts) + (f"; and {more} more" if more > 0 else "")


class BadEventError(CompactionWorkerError):
    """An input event that can never be processed; it belongs on the dead-letter topic."""

    def __init__(self, reason: DeadLetterReason, detail: str, conversation_id: str | None = None):
        super().__init__(f"{reason.value}: {detail}")
        self.reason = reason
        self.detail = detail
        self.conversation_id = conversation_id


class DeadLetter(_Event):
    """``conversation.turn.dlq``: an input that cannot be processed, with the original bytes."""

    reason: DeadLetterReason = Field(description="Machine-readable reason code.")
    detail: str = Field(description="What exactly was wrong, for a person.")
    conversation_id: str | None = None
    turn_seq: int | None = None
    source_topic: str
    partition: int | None = None
    offset: int | None = None
    key_b64: str | None = Field(default=None, description="The original Kafka key, base64.")
    original_b64: str = Field(
        description="The original event bytes, base64; only the first ones (see original_size) "
        "when the whole would not fit in one Kafka record (about 745 KB)."
    )
    original_size: int = Field(ge=0)


class CompactionProposed(_Event):
    """``compaction.proposed``: a compaction computed and not applied, for the runtime to approve
    (``Client.apply``) or discard (``Client.discard``); a conversation whose settings say
    ``pipeline.approval: manual`` gets its threshold and manual compactions this way.

    It follows the run's ``compaction.started``; its ``compaction.completed`` (the same
    ``compaction_id``) comes when it is applied (``compacted``) or not (``discarded``). Applied
    while the conversation is as it was (``version`` and ``last_seq``), it commits exactly this
    history; after new turns it is recomputed and proposed again instead.
    """

    conversation_id: ConversationId
    compaction_id: uuid.UUID = Field(
        description="The proposal's id: pass it to Client.apply or Client.discard."
    )
    trigger: Trigger
    version: int = Field(ge=0, description="The effective-history version it was computed from.")
    last_seq: int = Field(ge=0, description="The last turn it was computed from.")
    stages: list[str] = Field(default_factory=list)
    tokens_before: int = Field(ge=0)
    tokens_after: int = Field(ge=0)
    messages_before: int = Field(ge=0)
    messages_after: int = Field(ge=0)
    summary: str | None = Field(default=None, description="The summary the history would start with.")
    summarizer_model: str | None = None
    llm_usage: LlmUsage = Field(default_factory=LlmUsage)
    standing_state: StandingStateReport | None = None
    notes: list[str] = Field(default_factory=list)
    instructions: str | None = None
    replaces: uuid.UUID | None = Field(
        default=None, description="The earlier proposal this one replaces (recomputed after new turns)."
    )


EVENT_MODELS: dict[str, type[_Event]] = {
    TURNS_TOPIC: TurnEvent,
    STARTED_TOPIC: CompactionStarted,
    COMPLETED_TOPIC: CompactionCompleted,
    PROPOSED_TOPIC: CompactionProposed,
    DLQ_TOPIC: DeadLetter,
}
