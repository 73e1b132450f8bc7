"""Conversations sent to a worker as a runtime sends them, one turn at a time, through the broker and Redis.

Only the interface runtimes use (``Client.connect``, ``publish_turn``, ``wait_for``, ``messages``, the
turns and completion topics) and ``build_worker``: those are stable across releases, so this module
also drives another checkout's worker (``python traffic.py IN OUT`` with that checkout first on
``PYTHONPATH``; :func:`drive_in_child`). It imports nothing else of the package: no module another
release may lack.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaConsumer

from compaction_worker.client.client import Client
from compaction_worker.contracts.events import TurnEvent
from compaction_worker.runtime.topics import ensure_topics
from compaction_worker.runtime.worker import build_worker
from compaction_worker.settings import Settings

Messages = list[dict[str, Any]]
WAIT_SECONDS = 180.0
"""How long one turn (and the compaction it sets off) may take: a ceiling for a loaded machine."""


@dataclass(frozen=True, slots=True)
class Conversation:
    """One conversation to send: its id, model and turns (``turn_seq``, the messages the turn adds)."""

    conversation_id: str
    model: str
    turns: Sequence[tuple[int, Messages]]
    context_window: int | None = None


@dataclass(frozen=True, slots=True)
class Sent:
    """What the worker made of one conversation."""

    conversation_id: str
    after_turn: tuple[Messages, ...]
    """``Client.messages`` once each turn (and the compaction it set off) was done, in turn order."""
    versions: tuple[int, ...]
    """The effective history's version at the same moments: a compaction committed where it grows."""
    completed: tuple[dict[str, Any], ...]
    """The conversation's ``compaction.completed`` events, as published (JSON)."""

    @property
    def messages(self) -> Messages:
        return self.after_turn[-1] if self.after_turn else []


def settings_data(
    bootstrap_servers: str, redis_url: str, llm_url: str, *, label: str = "traffic"
) -> dict[str, Any]:
    """The settings of a run: the default ones, on fresh topics, a key prefix of its own and ``llm_url``'s summarizer."""
    suffix = uuid.uuid4().hex[:8]
    return {
        "kafka": {
            "bootstrap_servers": bootstrap_servers,
            "enable_idempotence": False,
            "group_id": f"{label}-{suffix}",
        },
        "redis": {"url": redis_url, "key_prefix": f"{label}{suffix}"},
        "topics": {
            name: f"{base}.{label}-{suffix}"
            for name, base in (
                ("turns", "conversation.turn"),
                ("started", "compaction.started"),
                ("completed", "compaction.completed"),
                ("dlq", "conversation.turn.dlq"),
            )
        },
        "summarizer": {
            "model": "openai/fake-summarizer",
            "api_base": llm_url,
            "api_key": "fake-key-0123456789",
        },
    }


async def drive(data: Mapping[str, Any], conversations: Sequence[Conversation]) -> list[Sent]:
    """Run a worker on the settings ``data``; send each conversation a turn at a time, waiting for each
    (and for the compaction it sets off) before the next, as an agent waits for its model; read back."""
    settings = Settings(**data)
    await ensure_topics(settings)
    out: list[Sent] = []
    async with build_worker(settings).running(), Client.connect(settings) as client:
        for conversation in conversations:
            cid = conversation.conversation_id
            after_turn: list[Messages] = []
            versions: list[int] = []
            for seq, messages in conversation.turns:
                fields: dict[str, Any] = {
                    "conversation_id": cid,
                    "turn_seq": seq,
                    "model": conversation.model,
                }
                if conversation.context_window is not None:
                    fields["context_window"] = conversation.context_window
                await client.publish_turn(TurnEvent.model_validate({**fields, "messages": messages}))
                versions.append(await client.wait_for(cid, timeout=WAIT_SECONDS))
                after_turn.append(list(await client.messages(cid)))
            out.append(Sent(cid, tuple(after_turn), tuple(versions), ()))
        events = await _events(settings, settings.topics.completed)
    return [
        Sent(
            s.conversation_id,
            s.after_turn,
            s.versions,
            tuple(e for e in events if e.get("conversation_id") == s.conversation_id),
        )
        for s in out
    ]


async def _events(settings: Settings, topic: str, idle: float = 2.0) -> list[dict[str, Any]]:
    """Every record of ``topic`` (JSON), from the beginning, until it has been quiet for ``idle`` seconds."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        group_id=f"reader-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest",
    )
    await consumer.start()
    values: list[dict[str, Any]] = []
    try:
        loop = asyncio.get_running_loop()
        quiet_since = loop.time()
        while loop.time() - quiet_since < idle:
            for records in (await consumer.getmany(timeout_ms=300)).values():
                values.extend(json.loads(r.value) for r in records)
                quiet_since = loop.time()
    finally:
        await consumer.stop()
    return values


def drive_in_child(
    source: Path, data: Mapping[str, Any], conversations: Sequence[Conversation], workdir: Path
) -> list[Sent]:
    """:func:`drive` in a child process whose package is ``source``'s (another checkout), run in ``workdir``."""
    given, taken = workdir / "traffic-in.json", workdir / "traffic-out.json"
    given.write_text(
        json.dumps(
            {
                "settings": data,
                "conversations": [
                    {
                        "conversation_id": c.conversation_id,
                        "model": c.model,
                        "turns": c.turns,
                        "context_window": c.context_window,
                    }
                    for c in conversations
                ],
            }
        )
    )
    paths = [str(source.resolve()), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(paths)}
    log = workdir / "traffic.log"
    with log.open("wb") as output:
        done = subprocess.run(
            # -P: the script's own directory (bench/) must not come first on the path.
            [sys.executable, "-P", str(Path(__file__).resolve()), str(given), str(taken)],
            cwd=workdir,
            env=environment,
            stdout=output,
            stderr=subprocess.STDOUT,
            check=False,
        )
    if done.returncode != 0:
        raise RuntimeError(f"the worker at {source} failed ({done.returncode}):\n{log.read_text()[-3000:]}")
    return [
        Sent(s["conversation_id"], tuple(s["after_turn"]), tuple(s["versions"]), tuple(s["completed"]))
        for s in json.loads(taken.read_text())
    ]


def _main(given: str, taken: str) -> None:
    data = json.loads(Path(given).read_text())
    conversations = [
        Conversation(
            c["conversation_id"], c["model"], [(seq, m) for seq, m in c["turns"]], c["context_window"]
        )
        for c in data["conversations"]
    ]
    sent = asyncio.run(drive(data["settings"], conversations))
    Path(taken).write_text(
        json.dumps(
            [
                {
                    "conversation_id": s.conversation_id,
                    "after_turn": s.after_turn,
                    "versions": s.versions,
                    "completed": s.completed,
                }
                for s in sent
            ]
        )
    )


if __name__ == "__main__":
    _main(*sys.argv[1:3])
