"""``compaction-worker conversation ...`` end to end: a worker on the real broker and Redis, turns
published to it, and every command of the group driven from the command line, in text and --json."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from click.testing import CliRunner, Result

from compaction_worker.cli import SCHEMAS_DIR, main
from compaction_worker.cli.conversation import TOP_LEVEL_ALIASES, conversation
from compaction_worker.contracts.events import CompactionCompleted, Outcome, Trigger
from compaction_worker.settings import Settings
from compaction_worker.testing import turn_event
from tests.integration.helpers import read_topic
from tests.orchestration import fresh_topics, make_settings, running_worker

pytestmark = pytest.mark.integration

Cli = Callable[..., Awaitable[Result]]


def _text(turn: int) -> str:
    role = "user" if turn % 2 else "assistant"
    return f"{role} turn {turn}: " + " ".join(f"point{turn}-{i}" for i in range(150))


def _schema(name: str) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads((SCHEMAS_DIR / "cli" / f"{name}.json").read_text()))


@pytest.fixture
def settings(kafka_bootstrap: str, redis_url: str) -> Settings:
    """A worker's settings whose profile ``careful`` waits for approval (the deployment's does not)."""
    return make_settings(
        kafka_bootstrap,
        redis_url,
        fresh_topics(),
        profiles={"careful": {"pipeline": {"approval": "manual"}}},
    )


@pytest.fixture
def cli(settings: Settings, tmp_path: Path) -> Cli:
    """Runs ``compaction-worker --config <the worker's settings> ARGS`` on a thread (the worker runs on
    the test's loop, the command on its own)."""
    config = tmp_path / "worker.yaml"
    config.write_text(yaml.safe_dump(settings.model_dump(mode="json", exclude_defaults=True)))

    async def run(*args: str) -> Result:
        return await asyncio.to_thread(CliRunner().invoke, main, ["--config", str(config), *args])

    return run


async def _json(cli: Cli, schema: str, *args: str) -> Any:
    """A command's --json output, checked against its committed schema in schemas/cli/."""
    result = await cli(*args, "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    _schema(schema).validate(data)
    return data


async def _fails(cli: Cli, *args: str, code: int = 1) -> str:
    """A refused command: its exit status, nothing on stdout, one line on stderr (returned)."""
    result = await cli(*args)
    assert result.exit_code == code, result.output
    assert result.stdout == ""
    (line,) = result.stderr.strip().splitlines()[-1:]
    return line


async def test_every_conversation_command_against_a_running_worker(settings: Settings, cli: Cli) -> None:
    """Issue 56: pin, unpin, status, proposal, discard, apply, versions, rewind (and history) from the
    command line, on a conversation a running worker stores and compacts under approval, each
    checked in text and in --json; refusals are one line on stderr and a non-zero exit."""
    cid = f"cli-{uuid.uuid4().hex[:8]}"
    async with running_worker(settings) as (_, client):
        for turn in range(1, 13):
            role = "user" if turn % 2 else "assistant"
            profile = {"profile": "careful"} if turn == 1 else {}
            await client.publish_turn(
                turn_event(cid, turn, [{"role": role, "content": _text(turn)}], **profile)
            )
        await client.wait_for(cid, timeout=60)

        # pin and unpin: the flag on the stored message, in text and --json.
        pinned = await _json(cli, "pin", "conversation", "pin", cid, "4")
        assert pinned == {
            "conversation_id": cid,
            "turn_seq": 4,
            "index": None,
            "pinned": True,
            "ordinals": [4],
        }
        unpinned = await _json(cli, "unpin", "conversation", "unpin", cid, "4", "--index", "0")
        assert (unpinned["pinned"], unpinned["index"], unpinned["ordinals"]) == (False, 0, [4])
        entry = next(e for e in (await client.snapshot(cid)).history.entries if e.n == 4)
        assert not entry.pinned
        text = await cli("conversation", "pin", cid, "4")
        assert text.exit_code == 0, text.output
        assert text.stdout == f"pinned turn 4 of {cid}: transcript message 4\n"
        entry = next(e for e in (await client.snapshot(cid)).history.entries if e.n == 4)
        assert entry.pinned

        # status before any compaction: the profile, nothing pending, nothing waiting.
        status = await _json(cli, "status", "conversation", "status", cid)
        assert (status["profile"], status["last_seq"], status["version"]) == ("careful", 12, 0)
        assert (status["pending_job"], status["proposal"]) == (None, None)
        assert await _json(cli, "proposal", "conversation", "proposal", cid) is None
        none_waits = await cli("conversation", "proposal", cid)
        assert none_waits.stdout == f"{cid}: no proposal waits for approval\n"

        # compact under approval: proposed, not applied; status and proposal show it.
        scheduled = await cli("conversation", "compact", cid)
        assert scheduled.stdout.startswith(f"manual compaction of {cid} scheduled; approval is manual")
        await client.wait_for(cid, timeout=60)
        first = await _json(cli, "proposal", "conversation", "proposal", cid)
        assert (first["outcome"], first["version"], first["stale"]) == ("compacted", 0, False)
        assert first["tokens_after"] < first["tokens_before"]
        kept = [m.get("content") for m in first["messages"]]
        assert _text(4) in kept  # pinned: kept verbatim, where the assistant's turns 2 and 6 are not
        assert _text(2) not in kept
        assert _text(6) not in kept
        status = await _json(cli, "status", "conversation", "status", cid)
        assert status["proposal"]["compaction_id"] == first["compaction_id"]
        assert status["proposal"]["trigger"] == "manual"
        shown = (await cli("conversation", "status", cid)).stdout
        assert "profile: careful" in shown
        assert f"proposal: compaction_id {first['compaction_id']}, trigger manual" in shown
        lines = (await cli("conversation", "proposal", cid)).stdout.splitlines()
        assert lines[0].startswith(f"{cid}: proposal {first['compaction_id']} (computed on version 0)")
        assert (
            lines[-1] == f"discard it: compaction-worker conversation discard {cid} {first['compaction_id']}"
        )

        # discard: gone, the history as it was; then a second proposal, applied.
        discarded = await _json(cli, "discard", "conversation", "discard", cid, first["compaction_id"])
        assert discarded == {
            "conversation_id": cid,
            "compaction_id": first["compaction_id"],
            "decision": "discarded",
            "version": 0,
            "tokens_before": None,
            "tokens_after": None,
        }
        assert (await _json(cli, "status", "conversation", "status", cid))["proposal"] is None
        assert (await cli("conversation", "compact", cid)).exit_code == 0
        await client.wait_for(cid, timeout=60)
        stale = await _json(cli, "proposal", "conversation", "proposal", cid)
        assert stale["compaction_id"] != first["compaction_id"]

        # A turn after it: shown stale; apply computes it again instead (a new proposal replaces it).
        await client.publish_turn(turn_event(cid, 13, [{"role": "user", "content": _text(13)}]))
        await client.wait_for(cid, timeout=60)
        shown_stale = await _json(cli, "proposal", "conversation", "proposal", cid)
        assert (shown_stale["compaction_id"], shown_stale["stale"], shown_stale["turns_since"]) == (
            stale["compaction_id"],
            True,
            1,
        )
        assert "stale: 1 turns arrived since" in (await cli("conversation", "proposal", cid)).stdout
        recomputed = await _json(cli, "apply", "conversation", "apply", cid, stale["compaction_id"])
        assert (recomputed["decision"], recomputed["version"], recomputed["tokens_after"]) == (
            "recomputed",
            0,
            None,
        )
        await client.wait_for(cid, timeout=60)
        second = await _json(cli, "proposal", "conversation", "proposal", cid)
        assert second["compaction_id"] not in (first["compaction_id"], stale["compaction_id"])
        assert second["stale"] is False
        applied = await cli("conversation", "apply", cid, second["compaction_id"])
        assert applied.exit_code == 0, applied.output
        assert applied.stdout.startswith(
            f"proposal {second['compaction_id']} of {cid} applied: now version 1, summarized, "
            f"~{second['tokens_before']} -> ~{second['tokens_after']} tokens"
        )
        await client.wait_for(cid, timeout=60)
        history = await _json(cli, "history", "conversation", "history", cid)
        assert history["version"] == 1
        assert history["chunks"]
        assert _text(4) in [m.get("content") for m in history["messages"]]

        # versions, then a rewind of the compaction, then versions again.
        versions = await _json(cli, "versions", "conversation", "versions", cid)
        assert [(v["version"], v["trigger"], v["in_effect"]) for v in versions] == [(1, "manual", True)]
        assert versions[0]["replaced_through"] > 0
        assert versions[0]["tokens_after"] == second["tokens_after"]
        listed = (await cli("conversation", "versions", cid)).stdout.splitlines()
        assert listed[0] == f"{cid}: version 1, 1 committed, 1 compactions in effect (marked *)"
        assert listed[1].startswith("* version 1 ")
        assert " UTC  manual: " in listed[1]
        rewound = await _json(cli, "rewind", "conversation", "rewind", cid)
        assert (rewound["rewound_version"], rewound["version"], rewound["context_status"]) == (1, 2, "full")
        versions = await _json(cli, "versions", "conversation", "versions", cid)
        assert [(v["version"], v["trigger"], v["rewound_version"], v["in_effect"]) for v in versions] == [
            (1, "manual", None, False),
            (2, "rewind", 1, False),
        ]
        assert "rewind of version 1" in (await cli("conversation", "versions", cid)).stdout

        # Refusals: one line on stderr, naming what happened; nothing on stdout.
        refused = await _fails(cli, "conversation", "apply", cid, first["compaction_id"])
        assert refused.startswith("Error: ")
        assert f"proposal {first['compaction_id']} is not pending" in refused
        assert "is not a valid UUID" in await _fails(cli, "conversation", "discard", cid, "nope", code=2)
        assert f"{cid} has no turn 99" in await _fails(cli, "conversation", "pin", cid, "99")
        assert "nothing to undo" in await _fails(cli, "conversation", "rewind", cid, "--json")
        assert "no conversation 'nope'" in await _fails(cli, "conversation", "versions", "nope", "--json")

        # The old top-level names answer as the group's commands do.
        for name in TOP_LEVEL_ALIASES:
            assert main.commands[name].callback is conversation.commands[name].callback
        assert await _json(cli, "status", "status", cid) == await _json(
            cli, "status", "conversation", "status", cid
        )

        events = [
            CompactionCompleted.model_validate_json(v)
            for v in await read_topic(settings, settings.topics.completed)
        ]
    ours = [(e.compaction_id, e.trigger) for e in events if e.conversation_id == cid]
    by_id = {e.compaction_id: e for e in events if e.conversation_id == cid}
    assert by_id[uuid.UUID(first["compaction_id"])].outcome is Outcome.DISCARDED
    assert by_id[uuid.UUID(second["compaction_id"])].outcome is Outcome.COMPACTED
    assert by_id[uuid.UUID(rewound["compaction_id"])].trigger is Trigger.REWIND
    replaced = by_id[uuid.UUID(stale["compaction_id"])]
    assert replaced.outcome is Outcome.DISCARDED
    assert f"replaced by proposal {second['compaction_id']}" in (replaced.error or "")
    assert len(ours) == 4, ours
