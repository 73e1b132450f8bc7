"""Settings: environment variables prefixed ``COMPACTION_`` (nested with ``__``), optional YAML.

Read once, by :func:`load_settings`, and passed down; nothing here reads the environment
at import time. Precedence: explicit arguments, then the environment, then the YAML file
(``--config`` or ``COMPACTION_CONFIG_FILE``), then the defaults below.
"""

from __future__ import annotations

import os
import re
import typing
from contextvars import ContextVar
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from compaction_worker.contracts.events import (
    COMPLETED_TOPIC,
    DLQ_TOPIC,
    PROPOSED_TOPIC,
    STARTED_TOPIC,
    TURNS_TOPIC,
)
from compaction_worker.errors import ConfigError
from compaction_worker.retry import RetrySettings

DEFAULT_PREFIX = "cw"
"""What every Redis key of this service starts with, unless ``redis.key_prefix`` says otherwise."""
DEFAULT_INDEX_SHARDS = 16
"""Buckets each shared index is split into, unless ``redis.index_shards`` says otherwise."""

_yaml_file: ContextVar[Path | None] = ContextVar("_yaml_file", default=None)


class _Section(BaseModel):
    """A settings section: a misspelt key is an error, not silently ignored."""

    model_config = ConfigDict(extra="forbid")


class KafkaSettings(_Section):
    """Where the broker is and how to talk to it; no bootstrap servers means embedded."""

    bootstrap_servers: str | None = None
    security_protocol: Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"] = "PLAINTEXT"
    sasl_mechanism: Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"] | None = None
    sasl_username: str | None = None
    sasl_password: SecretStr | None = None
    ssl_cafile: Path | None = None
    ssl_certfile: Path | None = None
    ssl_keyfile: Path | None = None
    group_id: str = "compaction-worker"
    client_id: str = "compaction-worker"
    # Brokers without InitProducerId support (the embedded one) need this off.
    enable_idempotence: bool = True
    consumers: int = Field(
        default=4, ge=1, description="Consumers in this process; partitions run in parallel."
    )
    max_event_bytes: int = Field(default=1_048_576, ge=1024)
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    batch_max_records: int = Field(
        default=500, ge=1, description="Most turns one consumer takes per fetch (one commit per batch)."
    )
    batch_timeout_ms: int = Field(
        default=200, ge=1, description="How long a fetch waits for turns when none are buffered."
    )
    fetch_max_wait_ms: int = Field(
        default=50,
        ge=1,
        description="How long the broker may hold a fetch with no new turns (a broker that does not "
        "answer early when turns arrive, as the embedded one, delays each turn up to this).",
    )
    batch_concurrency: int = Field(
        default=32,
        ge=1,
        description="Conversations handled at once per process, each one's turns in order "
        "(their per-turn Redis calls travel together, one round trip in flight a process).",
    )

    @property
    def max_fetch_bytes(self) -> int:
        """Bytes fetched per partition: room for the largest accepted event, at least 1 MiB."""
        return max(self.max_event_bytes * 2, 1_048_576)


class RedisSettings(_Section):
    """Where Redis is; no URL means embedded."""

    url: str | None = None
    password: SecretStr | None = None
    ssl: bool = False
    ssl_ca_certs: Path | None = None
    key_prefix: str = DEFAULT_PREFIX
    retention_seconds: int | None = Field(
        default=30 * 24 * 3600, ge=60, description="Idle conversations expire after this; None keeps them."
    )
    cluster: bool = Field(
        default=False,
        description="Speak Redis Cluster (also implied by a redis+cluster:// or rediss+cluster:// URL).",
    )
    index_shards: int = Field(
        default=DEFAULT_INDEX_SHARDS,
        ge=1,
        le=1024,
        description="Buckets (hash slots) each shared index (jobs, gaps, outbox) is split into; same on every worker.",
    )
    max_connections: int = Field(
        default=16,
        ge=2,
        description="Connections a process opens to a single Redis, at most: a command waits for a free one "
        "(up to the socket timeout) instead of opening another. A cluster client opens its own per node.",
    )

    @property
    def uses_cluster(self) -> bool:
        """Whether to use the cluster client: the ``cluster`` flag or a ``+cluster`` URL scheme."""
        return self.cluster or (self.url or "").split("://", 1)[0].endswith("+cluster")


class TopicSettings(_Section):
    """Topic names and the partition count used when this service creates them."""

    turns: str = TURNS_TOPIC
    started: str = STARTED_TOPIC
    completed: str = COMPLETED_TOPIC
    proposed: str = PROPOSED_TOPIC
    dlq: str = DLQ_TOPIC
    partitions: int = Field(default=8, ge=1)
    replication_factor: int = Field(default=1, ge=1)
    create: bool = Field(default=False, description="Create missing topics at start-up.")
    completed_summary: bool = Field(
        default=False,
        description="compaction.completed carries the summary text the history now starts with (off: only its size).",
    )


class BudgetSettings(_Section):
    """When to compact and how far down."""

    auto_compact: bool = Field(
        default=True,
        description="Compact when a threshold is crossed; false: only manual and reactive requests compact.",
    )
    trigger_fraction: float = Field(default=0.8, gt=0, le=1)
    soft_trigger_fraction: float | None = Field(default=None, gt=0, le=1)
    soft_break_even_calls: float | None = Field(
        default=None,
        gt=0,
        description="A soft-threshold compaction waits while it would need more later calls than this to pay "
        "for the prompt cache it rewrites (at the model's prices; the hard threshold never waits); None: never waits.",
    )
    target_fraction: float = Field(default=0.5, gt=0, le=1)
    reactive_target_fraction: float = Field(default=0.7, gt=0, le=1)
    floor_tokens: int = Field(default=1024, ge=0)
    fallback_window: int | None = Field(
        default=32_768, ge=256, description="Window for models the registry does not know; None rejects them."
    )
    window_overrides: dict[str, int] = Field(default_factory=dict)
    output_reserve_tokens: int | None = Field(default=None, ge=0)
    max_output_reserve_fraction: float = Field(default=0.25, gt=0, lt=1)
    image_tokens: int = Field(default=1024, ge=0)
    message_overhead_tokens: int = Field(default=4, ge=0)
    conversation_overhead_tokens: int = Field(
        default=24, ge=0, description="Every request's own framing (reply priming, separators), counted once."
    )
    noop_regrowth_fraction: float = Field(
        default=0.05, ge=0, le=1, description="After a no-op, growth (of available) needed before retrying."
    )
    min_saving_fraction: float = Field(
        default=0.1,
        ge=0,
        lt=1,
        description="A threshold compaction commits only if it saves this share of the history or brings one "
        "over the window under it; where what stays exceeds the target, the threshold moves up to where it can.",
    )

    @model_validator(mode="after")
    def _ordered(self) -> BudgetSettings:
        if self.target_fraction >= self.trigger_fraction:
            raise ValueError("target_fraction must be below trigger_fraction")
        if self.soft_trigger_fraction is not None and self.soft_trigger_fraction >= self.trigger_fraction:
            raise ValueError("soft_trigger_fraction must be below trigger_fraction")
        return self


class TailSettings(_Section):
    """How much of the recent history stays verbatim."""

    max_messages: int = Field(default=6, ge=0)
    max_fraction: float = Field(default=0.25, gt=0, le=1)


_WORKING_STATE = "Files read or edited and the plan, restored after a summary (within the target); 0: off."
_PLAN_TOOLS = "Names of the runtime's own plan tools, besides TodoWrite, update_plan and write_todos."


class PipelineSettings(_Section):
    """Which compaction stages run and their knobs; stages run cheapest first."""

    approval: Literal["auto", "manual"] = Field(
        default="auto",
        description="manual: a compaction is proposed (compaction.proposed) and applied only by Client.apply; "
        "a reactive one, after an overflow, and one of a history at what its window leaves for input "
        "never wait.",
    )
    prune: bool = Field(default=True, description="Replace old tool outputs with a placeholder.")
    prune_protect_tokens: int = Field(
        default=40_000, ge=0, description="Most recent tool output tokens kept."
    )
    prune_protect_fraction: float = Field(
        default=0.2, ge=0, le=1, description="The same, as a share of the window; the smaller wins."
    )
    prune_minimum_savings_tokens: int = Field(default=20_000, ge=0)
    prune_minimum_savings_fraction: float = Field(
        default=0.02, ge=0, le=1, description="Of the window; the smaller wins."
    )
    prune_keep_artifact_tokens: int = Field(
        default=80, ge=0, description="Errors, commands, paths a cleared output keeps verbatim; 0: none."
    )
    protected_tools: list[str] = Field(
        default_factory=lambda: ["skill"], description="Tool outputs never pruned."
    )
    deduplicate: bool = Field(
        default=True, description="Keep only the latest of repeated reads and identical outputs."
    )
    truncate_oversized: bool = Field(default=True, description="Head/tail-truncate single huge messages.")
    oversized_fraction: float = Field(
        default=0.25, gt=0, le=1, description="A message above this share of the window is huge."
    )
    summarize: bool = Field(default=True, description="Summarize older turns (LLM, then extractive).")
    summary_share: float = Field(
        default=0.3, gt=0, lt=1, description="Share of the room under the target for a new summary."
    )
    chunk_budget_fraction: float = Field(
        default=0.5, gt=0, le=1, description="Of the target; above it summaries fold."
    )
    artifact_budget_tokens: int = Field(
        default=400,
        ge=0,
        description="Verbatim paths, commands, errors kept per chunk, at least; 0: no ledger.",
    )
    artifact_budget_fraction: float = Field(
        default=0.05, ge=0, le=0.5, description="Of the window: a chunk's ledger budget, if larger."
    )
    summary_placement: Literal["separate", "merge"] = Field(
        default="separate",
        description="A user summary plus an assistant acknowledgment, or merged into the first kept user message.",
    )
    sliding_window: bool = Field(
        default=True, description="Last resort: drop the oldest turns, keep the first exchange."
    )
    oversized_keep_fraction: float = Field(
        default=0.1,
        gt=0,
        le=1,
        description="Of the window: what a huge message is cut to (head and tail); at most oversized_fraction.",
    )
    max_tool_output_bytes: int | None = Field(
        default=51_200,
        ge=1024,
        description="Tool outputs over this many UTF-8 bytes are cut; None: no limit.",
    )
    max_tool_output_lines: int | None = Field(
        default=2000, ge=10, description="Tool outputs over this many lines are cut; None: no limit."
    )
    task_max_tokens: int = Field(
        default=20_000,
        ge=0,
        description="The task (the first user message) stays verbatim up to this size; past it, its head, "
        "tail and distinctive terms; 0: summarized like any message.",
    )
    task_max_fraction: float = Field(
        default=0.2, gt=0, le=1, description="The same, as a share of the window; the smaller wins."
    )
    user_words_max_tokens: int = Field(
        default=20_000,
        ge=0,
        description="The user's most recent messages stay verbatim up to this many tokens in all (as Codex "
        "keeps them); 0: summarized like any message.",
    )
    user_words_max_fraction: float = Field(
        default=0.1, gt=0, le=1, description="The same, as a share of the window; the smaller wins."
    )
    standing_state_max_tokens: int = Field(
        default=2_000,
        ge=0,
        description="The user's rules, constraints, preferences, goals, decisions and facts kept verbatim after "
        "a summary (reserved under the target before any stage runs); 0: off.",
    )
    standing_state_max_fraction: float = Field(
        default=0.25,
        ge=0,
        le=0.5,
        description="The same, as a share of the room under the target; the smaller wins.",
    )
    working_state_max_tokens: int = Field(default=8_000, ge=0, description=_WORKING_STATE)
    working_state_max_files: int = Field(default=5, ge=0, description="The most recent files restored.")
    working_state_file_max_tokens: int = Field(default=3_000, ge=0, description="Larger files: path, size.")
    plan_tools: list[str] = Field(default_factory=list, description=_PLAN_TOOLS)


class SummarizerSettings(_Section):
    """The LLM that writes summaries; no model means the deterministic extractive summary."""

    model: str | None = Field(
        default=None,
        description="A LiteLLM model string, 'conversation' for the conversation's own model, or unset.",
    )
    api_base: str | None = None
    api_key: SecretStr | None = None
    timeout_seconds: float = Field(default=60.0, gt=0)
    fallback_models: list[str] = Field(default_factory=list)
    max_summary_tokens: int = Field(default=2048, ge=64)
    max_input_tokens: int | None = Field(
        default=None,
        ge=256,
        description="Prompt tokens the summarizer takes, if less than its window; larger spans go in pieces.",
    )
    breaker_failures: int = Field(
        default=3,
        ge=0,
        description="After this many failed LLM runs in a row on a model, by any conversation on any worker, "
        "skip that model for a while; 0: never.",
    )
    breaker_cooldown_seconds: float = Field(
        default=300.0,
        gt=0,
        description="How long the model is skipped; then one run tries it again while the others wait for its result.",
    )
    prompt: str | None = Field(default=None, description="Replaces the built-in instructions.")
    prompt_file: Path | None = None
    temperature: float = 0.0
    output: Literal["auto", "schema", "grammar", "json", "markdown"] = Field(
        default="auto",
        description="What the model is asked to write: 'schema', checked items as JSON with response_format "
        "(OpenAI's json_schema shape); 'grammar', the same schema as {'type': 'json_object', 'schema': ...}, "
        "the shape llama.cpp's server enforces as a grammar; "
        "'json', the same asked for in the prompt; 'markdown', sections of prose; 'auto', schema where "
        "LiteLLM says the model supports response_format, else json (markdown with a custom prompt). A "
        "JSON reply that cannot be used is asked again as Markdown.",
    )


class WorkerSettings(_Section):
    """The compaction pool inside each worker process, and how long a turn may wait for a gap."""

    max_concurrent_compactions: int = Field(default=4, ge=1)
    lock_ttl_seconds: float = Field(
        default=30.0,
        gt=0,
        description="A compaction's claim on its conversation: renewed while it runs, taken over once it expires.",
    )
    sweep_interval_seconds: float = Field(
        default=2.0,
        gt=0,
        description="How soon a sweep of the job, held-turn and outbox indexes follows one that found work.",
    )
    idle_sweep_max_seconds: float = Field(
        default=60.0,
        gt=0,
        description="While nothing happens, the sweeps back off to this period; announced work wakes a worker at once.",
    )
    shutdown_grace_seconds: float = Field(default=20.0, ge=0)
    gap_timeout_seconds: float = Field(
        default=300.0,
        gt=0,
        description="A turn held behind a missing turn_seq this long goes to the DLQ (sequence_gap).",
    )


class HealthSettings(_Section):
    """The worker's health port: ``/livez``, ``/readyz`` and ``/metrics``; off unless enabled."""

    enabled: bool = Field(
        default=False, description="Serve the health port (the container image turns it on)."
    )
    host: str = Field(default="127.0.0.1", description="Address to listen on; 0.0.0.0 in a container.")
    port: int = Field(default=8080, ge=0, le=65535, description="Port to listen on; 0 picks a free one.")
    liveness_timeout_seconds: float = Field(
        default=60.0,
        gt=0,
        description="/livez fails when the consume loop or the sweeper made no progress for this long.",
    )
    check_timeout_seconds: float = Field(
        default=2.0, gt=0, description="How long each /readyz check (Redis, broker, group) may take."
    )


class InspectorSettings(_Section):
    """``compaction-worker inspect``: a read-only web view of the conversations in Redis."""

    host: str = Field(default="127.0.0.1", description="Listen address; non-loopback needs a token.")
    port: int = Field(default=8090, ge=0, le=65535, description="Port to listen on; 0 picks a free one.")
    token: SecretStr | None = Field(default=None, description="Bearer token (header; ?token= sets a cookie).")
    list_limit: int = Field(default=50, ge=1, description="Conversations in each list of the index page.")
    scan_limit: int = Field(default=10_000, ge=1, description="Meta keys the index page reads (SCAN).")
    page_messages: int = Field(default=300, ge=1, description="Transcript messages per conversation page.")


PROFILE_NAME = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$"
"""What a profile's name may be (a turn's ``profile`` field names one)."""


class Profile(_Section):
    """Named overrides a conversation compacts under when it chooses them (a turn's ``profile``
    field, ``Client.set_profile``): a sub-agent's own threshold, target, tail, budgets, summarizer
    model or approval beside its parent's. Each section takes the keys of the deployment's section
    of that name (``budget.trigger_fraction``, ``pipeline.approval``, ``summarizer.model``, ...)
    and changes only those; the rest is the deployment's."""

    budget: dict[str, Any] = Field(default_factory=dict)
    tail: dict[str, Any] = Field(default_factory=dict)
    pipeline: dict[str, Any] = Field(default_factory=dict)
    summarizer: dict[str, Any] = Field(default_factory=dict)


class Settings(BaseSettings):
    """Everything the worker, the CLI and the client need, read once."""

    model_config = SettingsConfigDict(
        env_prefix="COMPACTION_",
        env_nested_delimiter="__",
        env_ignore_empty=True,
        extra="forbid",
    )

    kafka: KafkaSettings = Field(default_factory=KafkaSettings)
    redis: RedisSettings = Field(default_factory=RedisSettings)
    topics: TopicSettings = Field(default_factory=TopicSettings)
    budget: BudgetSettings = Field(default_factory=BudgetSettings)
    tail: TailSettings = Field(default_factory=TailSettings)
    pipeline: PipelineSettings = Field(default_factory=PipelineSettings)
    summarizer: SummarizerSettings = Field(default_factory=SummarizerSettings)
    worker: WorkerSettings = Field(default_factory=WorkerSettings)
    retry: RetrySettings = Field(default_factory=RetrySettings)
    health: HealthSettings = Field(default_factory=HealthSettings)
    inspector: InspectorSettings = Field(default_factory=InspectorSettings)
    profiles: dict[str, Profile] = Field(
        default_factory=dict,
        description="Named overrides of budget, tail, pipeline and summarizer a conversation can choose "
        "(a turn's profile field, Client.set_profile).",
    )
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR"] = "INFO"
    log_json: bool = False

    # The flat names DESIGN.md promises, as aliases of the nested ones.
    kafka_bootstrap_servers: str | None = Field(default=None, exclude=True)
    redis_url: str | None = Field(default=None, exclude=True)
    summarizer_model: str | None = Field(default=None, exclude=True)
    summarizer_api_base: str | None = Field(default=None, exclude=True)
    summarizer_api_key: SecretStr | None = Field(default=None, exclude=True)
    trigger_fraction: float | None = Field(default=None, exclude=True)
    _by_profile: dict[str, Settings] = PrivateAttr(default_factory=dict)

    @model_validator(mode="after")
    def _apply_flat_aliases(self) -> Settings:
        if self.kafka_bootstrap_servers:
            self.kafka.bootstrap_servers = self.kafka_bootstrap_servers
        if self.redis_url:
            self.redis.url = self.redis_url
        if self.summarizer_model:
            self.summarizer.model = self.summarizer_model
        if self.summarizer_api_base:
            self.summarizer.api_base = self.summarizer_api_base
        if self.summarizer_api_key:
            self.summarizer.api_key = self.summarizer_api_key
        if self.trigger_fraction is not None:
            self.budget = BudgetSettings.model_validate(
                {**self.budget.model_dump(), "trigger_fraction": self.trigger_fraction}
            )
        return self

    @model_validator(mode="after")
    def _profiles_resolve(self) -> Settings:
        # Each profile is checked now, merged with the deployment's sections: a misspelt key or a
        # value out of range is an error at start-up, not at a conversation's compaction.
        self._by_profile = {}
        for name in self.profiles:
            if re.fullmatch(PROFILE_NAME, name) is None:
                raise ValueError(f"profile name {name!r} must match {PROFILE_NAME}")
            try:
                self._by_profile[name] = self._merged(self.profiles[name])
            except ValueError as e:
                raise ValueError(f"profile {name!r}: {e}") from e
        return self

    def _merged(self, profile: Profile) -> Settings:
        sections: dict[str, Any] = {}
        for section, changes in profile:
            if changes:
                base: BaseModel = getattr(self, section)
                sections[section] = type(base).model_validate({**base.model_dump(), **changes})
        return self.model_copy(update=sections)

    @cached_property
    def budgets(self) -> dict[str, BudgetSettings]:
        """Each profile's budget section, by name (a turn reads its profile's here: no call)."""
        return {name: merged.budget for name, merged in self._by_profile.items()}

    def for_profile(self, name: str | None) -> Settings:
        """The settings a conversation of profile ``name`` compacts under: the deployment's, with
        the profile's overrides; the deployment's own for no name, or a name no longer configured."""
        return self._by_profile.get(name, self) if name else self

    @model_validator(mode="after")
    def _gap_timeout_within_retention(self) -> Settings:
        # Held turns expire with their conversation; a longer timeout would lose them silently.
        retention = self.redis.retention_seconds
        if retention is not None and self.worker.gap_timeout_seconds >= retention:
            raise ValueError("worker.gap_timeout_seconds must be below redis.retention_seconds")
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        yaml_file = _yaml_file.get()
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        if yaml_file is not None:
            sources.append(YamlConfigSettingsSource(settings_cls, yaml_file=yaml_file))
        return tuple(sources)


def load_settings(config_file: Path | None = None, **overrides: object) -> Settings:
    """Read the settings once: arguments, then environment, then the YAML file, then defaults."""
    from_env = os.environ.get("COMPACTION_CONFIG_FILE")
    path = config_file or (Path(from_env) if from_env else None)
    if path is not None and not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    token = _yaml_file.set(path)
    try:
        return Settings(**overrides)  # type: ignore[arg-type]  # overrides are validated by pydantic
    finally:
        _yaml_file.reset(token)


def env_name(path: str) -> str:
    """A setting's environment variable, from its dotted path (``kafka.group_id``: ``COMPACTION_KAFKA__GROUP_ID``)."""
    prefix, delimiter = (
        Settings.model_config.get("env_prefix", ""),
        Settings.model_config.get("env_nested_delimiter"),
    )
    return f"{prefix}{str(delimiter).join(path.split('.')).upper()}"


def literal_values(annotation: Any) -> list[str]:
    """The values of the ``Literal`` types in an annotation (also inside ``Optional`` and unions)."""
    if typing.get_origin(annotation) is Literal:
        return [str(v) for v in typing.get_args(annotation)]
    return [v for arg in typing.get_args(annotation) for v in literal_values(arg)]
