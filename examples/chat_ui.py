"""A chat UI's view of compactions: "compacting…" while one runs, the sizes before and after once it lands.

    python examples/chat_ui.py [CONVERSATION] [--from-beginning]

It subscribes to ``compaction.started`` and ``compaction.completed`` (the same settings as the
worker: ``COMPACTION_*``) and prints what a chat window would show above the message box.
"""

import asyncio
import sys
import uuid

from aiokafka import AIOKafkaConsumer

from compaction_worker.contracts.events import CompactionCompleted, CompactionStarted, Outcome
from compaction_worker.runtime.connections import kafka_client_args
from compaction_worker.settings import Settings, load_settings


def started_line(event: CompactionStarted) -> str:
    """What the UI shows while a compaction runs."""
    return f"[{event.conversation_id}] compacting… ({event.tokens_before:,} of {event.window:,} tokens)"


def completed_line(event: CompactionCompleted) -> str:
    """What the UI shows when a compaction has landed (or why the history stayed as it was)."""
    sizes = (
        f"{event.messages_before} messages, {event.tokens_before:,} tokens"
        f" → {event.messages_after} messages, {event.tokens_after:,} tokens"
    )
    if event.outcome is not Outcome.COMPACTED:
        return f"[{event.conversation_id}] not compacted ({event.outcome.value}): {sizes}"
    return f"[{event.conversation_id}] compacted: {sizes} (history version {event.version})"


async def watch(settings: Settings, conversation_id: str | None = None, from_beginning: bool = False) -> None:
    """Print a line per compaction event of ``conversation_id`` (every conversation if None), until cancelled."""
    topics = settings.topics
    consumer = AIOKafkaConsumer(
        topics.started,
        topics.completed,
        bootstrap_servers=settings.kafka.bootstrap_servers,
        # A group of its own: every UI sees every event; the UI shows only what happens from now on.
        group_id=f"chat-ui-{uuid.uuid4().hex[:8]}",
        auto_offset_reset="earliest" if from_beginning else "latest",
        **kafka_client_args(settings.kafka),
    )
    await consumer.start()
    try:
        async for record in consumer:
            if record.value is None:
                continue
            if record.topic == topics.started:
                started = CompactionStarted.model_validate_json(record.value)
                cid, line = started.conversation_id, started_line(started)
            else:
                completed = CompactionCompleted.model_validate_json(record.value)
                cid, line = completed.conversation_id, completed_line(completed)
            if conversation_id in (None, cid):
                print(line, flush=True)
    finally:
        await consumer.stop()


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    asyncio.run(watch(load_settings(), args[0] if args else None, "--from-beginning" in sys.argv))
