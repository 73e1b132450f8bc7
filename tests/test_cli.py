"""The command line: run on embedded defaults, history, status, compact, rewind, artifacts, schemas and quality."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import redis as redis_sync
import redis.asyncio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from click.testing import CliRunner

from compaction_worker.bench.environment import START_CEILING
from compaction_worker.cli import SCHEMAS_DIR, main
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger
from compaction_worker.conversation.meta import write_field
from compaction_worker.runtime.pool import run_job
from compaction_worker.settings import Settings
from compaction_worker.state.jobs import JobQueue
from compaction_worker.state.lock import Locks
from compaction_worker.state.proposals import Proposals
from compaction_worker.state.store import Store
from compaction_worker.testing import turn_bytes
from tests.conversation.test_status import proposal_from
from tests.orchestration import Published, make_parts
from tests.runtime.test_compactor import compact_mentions
from tests.trajectories import DATA, load_trajectories

pytestmark = pytest.mark.integration


def _json_output(args: list[str], schema: str) -> Any:
    """A command's ``--json`` output, validated against its committed schema in schemas/cli/."""
    result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    validator = jsonschema.Draft202012Validator(
        json.loads((SCHEMAS_DIR / "cli" / f"{schema}.json").read_text())
    )
    validator.validate(data)
    return data


async def _noop_publish(topic: str, payload: bytes, key: bytes | None) -> None:
    return None


@pytest.fixture
async def conversation(
    redis_client: redis.asyncio.Redis, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> str:
    """A stored three-turn conversation; the CLI is pointed at its Redis."""
    monkeypatch.setenv("COMPACTION_REDIS__URL", redis_url)
    handler = make_parts(redis_client, Settings(), _noop_publish).turns
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "read_file", "arguments": '{"path": "a.py"}'},
    }
    turns: list[list[dict[str, Any]]] = [
        [{"role": "user", "content": "Fix the bug in a.py"}],
        [
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": "call_1", "content": "def f(): return 1"},
        ],
        [{"role": "assistant", "content": "Fixed."}],
    ]
    for seq, messages in enumerate(turns, start=1):
        payload = turn_bytes("cli-conv", seq, messages, system_prompt="Be careful." if seq == 1 else None)
        await handler.handle(payload, b"cli-conv")
    return "cli-conv"


def test_history_for_a_person(conversation: str) -> None:
    """The effective history prints one line per message, with tool calls spelled out."""
    result = CliRunner().invoke(main, ["history", conversation])
    assert result.exit_code == 0, result.output
    assert "cli-conv: version 0, full, 5 messages" in result.output
    assert '[assistant] → read_file({"path": "a.py"})' in result.output
    assert "[tool call_1] def f(): return 1" in result.output


def test_history_json_and_full(conversation: str) -> None:
    """Reference 003 (the full history stays available): --json gives the provider-ready messages; --full gives the transcript records."""
    effective = _json_output(["history", conversation, "--json"], "history")
    assert [m["role"] for m in effective["messages"]] == ["system", "user", "assistant", "tool", "assistant"]
    full = _json_output(["history", conversation, "--full", "--json"], "history-full")
    assert [r["ordinal"] for r in full] == [1, 2, 3, 4]
    assert [r["turn_seq"] for r in full] == [1, 2, 2, 3]
    assert (full[3]["message"]["role"], full[3]["message"]["content"]) == ("assistant", "Fixed.")
    assert set(full[0]) == {"ordinal", "turn_seq", "message", "appended_at", "tokens"}
    assert full[0]["tokens"] > 0
    assert full[0]["appended_at"] > 1.7e9


def test_full_history_for_a_person(conversation: str) -> None:
    """--full prints each transcript message with its ordinal and turn."""
    result = CliRunner().invoke(main, ["history", conversation, "--full"])
    assert result.exit_code == 0, result.output
    assert "cli-conv: transcript, 4 messages over 3 turns" in result.output
    assert "#4    turn 3    [assistant] Fixed." in result.output


def test_status_and_compact(conversation: str) -> None:
    """References 000 and 002 (/compact) and 004 (context stats): status reports the budget; compact schedules a manual compaction."""
    status = _json_output(["status", conversation, "--json"], "status")
    assert (status["last_seq"], status["messages"], status["pending_compaction"]) == (3, 4, None)
    assert status["window"] == 128_000
    parts = status["tokens_by_part"]
    assert set(parts) == {"system", "tools", "framing", "history"}
    assert sum(parts.values()) == status["tokens"] > 0
    assert status["usage_ratio"] == round(status["tokens"] / status["window"], 4)
    assert status["available"] < status["window"]
    assert status["should_compact"] is False
    assert (status["profile"], status["pending_job"], status["proposal"]) == (None, None, None)
    assert CliRunner().invoke(main, ["compact", conversation]).exit_code == 0
    status = _json_output(["status", conversation, "--json"], "status")
    assert status["pending_compaction"] == "manual"
    job = status["pending_job"]
    assert (job["trigger"], job["running"], job["backing_off_until"]) == ("manual", False, None)
    assert job["due_at"] == pytest.approx(time.time(), abs=30)


async def test_status_shows_the_profile_the_job_and_a_waiting_proposal(
    conversation: str, redis_client: redis.asyncio.Redis
) -> None:
    """Issue 56: status shows the profile, the pending job (backing off after a failed run) and a
    waiting proposal, stale once a turn arrived after it; in --json and for a person."""
    settings = Settings()
    store = Store(redis_client, settings.redis.key_prefix, 3600)
    await write_field(redis_client, store.keys(conversation).meta, "profile", "tight", 0)
    jobs = JobQueue(redis_client, store.prefix, Locks(redis_client, 30), shards=settings.redis.index_shards)
    await jobs.schedule(conversation, Trigger.REACTIVE, "too long", delay_seconds=60)
    until = time.time() + 60
    await store.set_meta(conversation, retry_after=until, failures=1)
    snapshot = await store.snapshot(conversation)
    proposal = proposal_from(snapshot.meta, snapshot.entry_count)
    await Proposals(store).put(conversation, proposal)

    status = await asyncio.to_thread(_json_output, ["status", conversation, "--json"], "status")

    assert (status["profile"], status["pending_compaction"], status["failures"]) == ("tight", "reactive", 1)
    job = status["pending_job"]
    assert (job["trigger"], job["running"], job["backing_off_until"]) == ("reactive", False, until)
    assert status["proposal"] == {
        "compaction_id": str(proposal.compaction_id),
        "trigger": "threshold",
        "tokens_before": 90,
        "tokens_after": 20,
        "stale": False,
        "turns_since": 0,
    }
    handler = make_parts(redis_client, settings, _noop_publish).turns
    await handler.handle(turn_bytes(conversation, 4, [{"role": "user", "content": "and b.py"}]), b"cli-conv")
    text = (await asyncio.to_thread(CliRunner().invoke, main, ["status", conversation])).output
    assert "profile: tight" in text
    assert "pending_job: trigger reactive, running False, due_at" in text
    assert f"proposal: compaction_id {proposal.compaction_id}, trigger threshold" in text
    assert "stale True, turns_since 1" in text


def test_unknown_conversation_is_a_clear_error(conversation: str) -> None:
    """Asking for a conversation that does not exist fails with a message, not a traceback."""
    result = CliRunner().invoke(main, ["history", "nope"])
    assert result.exit_code == 1
    assert "no conversation 'nope'" in result.output


@pytest.fixture
async def compacted(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    kafka_bootstrap: str,
    make_topics: Any,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[str, Settings]:
    """A twelve-turn conversation with one committed compaction; the CLI is pointed at its Redis and broker."""
    started, completed = await make_topics("started", "completed")
    for name, value in {
        "REDIS__URL": redis_url,
        "KAFKA__BOOTSTRAP_SERVERS": kafka_bootstrap,
        "KAFKA__ENABLE_IDEMPOTENCE": "false",
        "TOPICS__STARTED": started,
        "TOPICS__COMPLETED": completed,
    }.items():
        monkeypatch.setenv(f"COMPACTION_{name}", value)
    settings = Settings()
    parts = make_parts(redis_client, settings, _noop_publish)
    cid = "cli-rewind"
    for seq in range(1, 13):
        role = "user" if seq % 2 else "assistant"
        text = f"{role} turn {seq}: " + " ".join(f"point{seq}-{i}" for i in range(150))
        await parts.turns.handle(turn_bytes(cid, seq, [{"role": role, "content": text}]), None)
    await parts.jobs.schedule(cid, Trigger.MANUAL)
    done = await run_job(parts.jobs, parts.compactor, cid)
    assert done is not None
    assert done.outcome is Outcome.COMPACTED, done.error
    return cid, settings


async def _first_record(settings: Settings, topic: str) -> bytes:
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=settings.kafka.bootstrap_servers, auto_offset_reset="earliest"
    )
    await consumer.start()
    try:
        record = await asyncio.wait_for(consumer.getone(), timeout=30)
    finally:
        await consumer.stop()
    assert isinstance(record.value, bytes)
    return record.value


def test_rewind_undoes_the_latest_compaction(compacted: tuple[str, Settings]) -> None:
    """`rewind` restores the history from before the compaction and tells consumers the new version."""
    cid, settings = compacted
    result = CliRunner().invoke(main, ["rewind", cid])
    assert result.exit_code == 0, result.output
    assert f"rewound compaction 1 of {cid}: now version 2, full, 0 summary chunks, 12 messages verbatim" in (
        result.output
    )
    event = CompactionCompleted.model_validate_json(
        asyncio.run(_first_record(settings, settings.topics.completed))
    )
    assert (event.conversation_id, event.trigger, event.version) == (cid, Trigger.REWIND, 2)
    history = _json_output(["history", cid, "--json"], "history")
    assert (history["version"], history["chunks"], len(history["messages"])) == (2, [], 12)


def test_compact_dry_run_shows_the_compaction_and_writes_nothing(compacted: tuple[str, Settings]) -> None:
    """Issue 37: `compact --dry-run` prints what a manual compaction would do; the history stays."""
    cid, _ = compacted
    before = _json_output(["history", cid, "--json"], "history")
    text = CliRunner().invoke(main, ["compact", cid, "--dry-run"])
    data = _json_output(
        ["compact", cid, "--dry-run", "--json", "--instructions", "keep the points"], "compact-dry-run"
    )

    assert text.exit_code == 0, text.output
    assert f"{cid} (version 1): a manual compaction would be" in text.output
    assert "(nothing written)" in text.output
    assert (data["conversation_id"], data["version"]) == (cid, 1)
    assert data["outcome"] in ("compacted", "noop")
    assert _json_output(["history", cid, "--json"], "history") == before


def test_rewind_json_and_refusals(compacted: tuple[str, Settings]) -> None:
    """--json prints the result; nothing left to undo and unknown versions fail with a clear message."""
    cid, _ = compacted
    unknown = CliRunner().invoke(main, ["rewind", cid, "--version", "5"])
    assert unknown.exit_code == 1
    assert "no compaction version 5 (compactions: 1)" in unknown.output
    before = _json_output(["history", cid, "--json"], "history")
    assert [c["first_seq"] for c in before["chunks"]] == [2]  # turn 1, the task, stays verbatim
    data = _json_output(["rewind", cid, "--version", "1", "--json"], "rewind")
    assert (data["rewound_version"], data["version"], data["context_status"]) == (1, 2, "full")
    assert (data["restored_messages"], data["messages_after"]) == (12, 12)
    assert data["tokens_after"] > data["tokens_before"]
    again = CliRunner().invoke(main, ["rewind", cid])
    assert again.exit_code == 1
    assert "nothing to undo" in again.output
    missing = CliRunner().invoke(main, ["rewind", "nope"])
    assert "no conversation 'nope'" in missing.output


@pytest.fixture
async def archived(
    redis_client: redis.asyncio.Redis,
    redis_url: str,
    settings: Settings,
    published: Published,
    monkeypatch: pytest.MonkeyPatch,
) -> CompactionCompleted:
    """Conversation "a", compacted once by a summarizer that keeps no artifact; the CLI points at its Redis."""
    monkeypatch.setenv("COMPACTION_REDIS__URL", redis_url)
    monkeypatch.setenv("COMPACTION_REDIS__KEY_PREFIX", settings.redis.key_prefix)
    done, _ = await compact_mentions(redis_client, settings, published)
    return done


def test_artifacts_lists_every_archived_artifact(archived: CompactionCompleted) -> None:
    """Issue 9: `artifacts` lists what compactions extracted, marking what the effective history lost."""
    data = _json_output(["artifacts", "a", "--json"], "artifacts")
    assert {"kind": "id", "text": "INC-40002", "turn_seq": 2, "ordinal": 2} in [
        {k: a[k] for k in ("kind", "text", "turn_seq", "ordinal")} for a in data
    ]
    assert sum(not a["in_history"] for a in data) == archived.artifacts_dropped > 0
    result = CliRunner().invoke(main, ["artifacts", "a"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    assert lines[0] == (
        f"a: {len(data)} artifacts archived, {archived.artifacts_dropped} no longer in the effective "
        "history (marked *)"
    )
    assert len(lines) == 1 + len(data)
    assert sum(line.startswith("*") for line in lines[1:]) == archived.artifacts_dropped
    missing = CliRunner().invoke(main, ["artifacts", "nope"])
    assert missing.exit_code == 1
    assert "no conversation 'nope'" in missing.output


def test_artifacts_does_not_load_litellm(archived: CompactionCompleted) -> None:
    """The command reads Redis only: it starts without importing LiteLLM (seconds of start-up)."""
    script = (
        "import json, sys\n"
        "from click.testing import CliRunner\n"
        "from compaction_worker.cli import main\n"
        "result = CliRunner().invoke(main, ['artifacts', 'a', '--json'])\n"
        "assert result.exit_code == 0, result.output\n"
        "print(len(json.loads(result.output)), 'litellm' in sys.modules)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60
    )
    count, loaded = out.stdout.split()
    assert (int(count) > 0, loaded) == (True, "False")


def test_schemas_check_passes_on_the_committed_files() -> None:
    """The committed schemas match the models."""
    result = CliRunner().invoke(main, ["schemas", "--check"])
    assert result.exit_code == 0, result.output


def test_quality_runs_a_suite_with_its_own_options(tmp_path: Path) -> None:
    """`quality SUITE ARGS...` runs one of bench/'s quality suites, offline: the published runs on
    one window, then one standing-state case; a folder with no runs, or no such suite, is a usage error."""
    runner = CliRunner()
    small = runner.invoke(
        main, ["quality", "small-windows", "--windows", "8192", "--trajectories", str(DATA), "--json"]
    )
    assert small.exit_code == 0, small.output
    rows = json.loads(small.output)
    assert [row["run"] for row in rows] == [run.name for run in load_trajectories()]
    assert all(row["window"] == 8192 and row["over_window"] == 0 for row in rows), rows
    assert sum(row["compactions"] for row in rows) >= 1
    args = ["--seeds", "7", "--windows", "8192", "--budgets", "0.3", "--only", "extractive", "--json"]
    standing = runner.invoke(main, ["quality", "standing", *args])
    assert standing.exit_code == 0, standing.output
    (case,) = json.loads(standing.output)
    assert (case["summarizer"], case["window"], case["budget"]) == ("extractive", 8192, 0.3)
    assert case["worst_round"]["rule"] == case["worst_round"]["constraint"] == 1.0
    empty = runner.invoke(main, ["quality", "small-windows", "--trajectories", str(tmp_path)])
    assert empty.exit_code == 2
    assert f"no <agent>/<run>.traj or .traj.json under {tmp_path}" in empty.output
    assert runner.invoke(main, ["quality", "nope"]).exit_code == 2


@pytest.mark.slow
def test_demo_json_lines_are_completed_events(monkeypatch: pytest.MonkeyPatch) -> None:
    """`demo --json` prints one compaction.completed per line, each valid against schemas/cli/demo.json."""
    for name in [k for k in os.environ if k.startswith("COMPACTION_")]:
        monkeypatch.delenv(name)
    result = CliRunner().invoke(
        main, ["demo", "--json", "--turns", "14", "--conversations", "1", "--window", "1500"]
    )
    assert result.exit_code == 0, result.output
    validator = jsonschema.Draft202012Validator(json.loads((SCHEMAS_DIR / "cli" / "demo.json").read_text()))
    events = [json.loads(line) for line in result.output.splitlines()]
    assert events, "the demo compacted nothing"
    for event in events:
        validator.validate(event)
    assert CompactionCompleted.model_validate(events[-1]).conversation_id == "demo-1"


def _python(script: str) -> str:
    """Run ``script`` in a fresh interpreter (the test process has LiteLLM loaded already)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, check=True, timeout=60, env=env
    )
    return out.stdout


HEAVY = (
    "litellm",
    "faststream",
    "redis",
    "aiokafka",
    "numpy",
    "bm25s",
    "opentelemetry.sdk",
    "pydantic_settings",
)
"""What a command imports when it runs, never at the CLI's start (``--help`` under 0.5 s, issue 32)."""


def test_importing_the_cli_loads_none_of_what_the_commands_need() -> None:
    """The CLI module imports click and its own command declarations only: each command imports what it uses."""
    script = f"import sys, compaction_worker.cli\nprint(*[m for m in {HEAVY!r} if m in sys.modules])"
    assert _python(script).split() == []


def test_the_worker_module_imports_without_litellm() -> None:
    """A worker starts consuming without LiteLLM (seconds of import): it loads on a thread beside the start."""
    script = "import sys, compaction_worker.runtime.worker\nprint('litellm' in sys.modules)"
    assert _python(script).split() == ["False"]


def test_help_starts_without_litellm() -> None:
    """`compaction-worker --help` prints the commands (not the top-level aliases) and never imports LiteLLM."""
    script = (
        "import sys\n"
        "from compaction_worker.cli import main\n"
        "try:\n"
        "    main(['--help'])\n"
        "except SystemExit as e:\n"
        "    assert e.code == 0, e.code\n"
        "print('litellm loaded:', 'litellm' in sys.modules)\n"
    )
    out = _python(script)
    assert "  conversation  Read and steer one conversation" in out
    assert "  replay  " in out
    assert "  status  " not in out  # an alias of `conversation status`, hidden
    assert out.splitlines()[-1] == "litellm loaded: False"


def test_invalid_settings_are_reported(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong setting stops the CLI with a readable error."""
    monkeypatch.setenv("COMPACTION_BUDGET__TRIGGER_FRACTION", "1.5")
    result = CliRunner().invoke(main, ["status", "x"])
    assert result.exit_code == 1
    assert "invalid settings" in result.output


@pytest.fixture
def run_process() -> Iterator[subprocess.Popen[str]]:
    """`compaction-worker run` with nothing configured, as the README gives it."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("COMPACTION_")}
    env["COMPACTION_WORKER__SHUTDOWN_GRACE_SECONDS"] = "2"
    process = subprocess.Popen(
        [sys.executable, "-m", "compaction_worker.cli", "run"],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
    )
    try:
        yield process
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


def test_run_on_embedded_defaults(run_process: subprocess.Popen[str]) -> None:
    """`run` starts an embedded broker and Redis, says where, consumes a turn, and stops on SIGTERM."""
    assert run_process.stdout is not None
    found: dict[str, str] = {}
    lines: list[str] = []
    # Its own signal, not a clock: every line up to "worker consuming" (the consumers hold their
    # partitions); pytest's timeout is the ceiling, and a failure shows what it printed.
    while not any("worker consuming" in line for line in lines):
        line = run_process.stdout.readline()
        assert line, f"the worker exited: {''.join(lines)}"
        lines.append(line)
        if m := re.search(r"export (COMPACTION_KAFKA__BOOTSTRAP_SERVERS|COMPACTION_REDIS__URL)=(\S+)", line):
            found[m.group(1)] = m.group(2)
    assert len(found) == 2, "".join(lines)
    # Where it says where the broker listens, it says which clients cannot talk to it.
    assert any("librdkafka" in line and "docker-compose" in line for line in lines), "".join(lines)

    async def publish() -> None:
        producer = AIOKafkaProducer(bootstrap_servers=found["COMPACTION_KAFKA__BOOTSTRAP_SERVERS"])
        await producer.start()
        try:
            payload = turn_bytes("from-cli", 1, [{"role": "user", "content": "hello"}])
            await producer.send_and_wait("conversation.turn", payload, key=b"from-cli")
        finally:
            await producer.stop()

    asyncio.run(publish())
    client = redis_sync.Redis.from_url(found["COMPACTION_REDIS__URL"])
    deadline = time.monotonic() + START_CEILING
    while time.monotonic() < deadline and not client.exists("cw:{from-cli}:transcript"):
        time.sleep(0.2)
    assert client.lrange("cw:{from-cli}:transcript", 0, -1), "the turn never reached Redis"
    run_process.send_signal(signal.SIGTERM)
    assert run_process.wait(timeout=30) == 0
