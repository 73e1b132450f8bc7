"""Log lines carry what they are about: fields bound once, in every record inside, tasks included."""

from __future__ import annotations

import asyncio
import io
import json
import logging

from compaction_worker.observability.logs import ContextFilter, JsonFormatter, TextFormatter, bound, context


def _capture(formatter: logging.Formatter) -> tuple[logging.Logger, io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(formatter)
    handler.addFilter(ContextFilter())
    logger = logging.getLogger(f"test-logs-{id(stream)}")
    logger.handlers[:] = [handler]
    logger.propagate = False
    logger.setLevel(logging.INFO)
    return logger, stream


def test_bound_fields_reach_every_json_line_inside_and_none_after() -> None:
    logger, stream = _capture(JsonFormatter())
    with bound(conversation_id="c-1"):
        logger.info("outer")
        with bound(turn_seq=7, job=None):  # None binds nothing
            logger.info("inner")
        logger.info("outer again")
    logger.info("outside")
    lines = [json.loads(line) for line in stream.getvalue().splitlines()]
    assert [(line["msg"], line.get("conversation_id"), line.get("turn_seq")) for line in lines] == [
        ("outer", "c-1", None),
        ("inner", "c-1", 7),
        ("outer again", "c-1", None),
        ("outside", None, None),
    ]
    assert "job" not in lines[1]


def test_text_lines_end_with_the_fields_before_any_traceback() -> None:
    logger, stream = _capture(TextFormatter())
    with bound(conversation_id="c-2", turn_seq=3):
        try:
            raise ValueError("boom")
        except ValueError:
            logger.exception("it failed")
    first, *rest = stream.getvalue().splitlines()
    assert first.endswith("it failed  conversation_id=c-2 turn_seq=3")
    assert rest[0].startswith("Traceback")


async def test_tasks_started_inside_keep_the_binding_and_do_not_leak_theirs() -> None:
    seen: list[dict[str, object]] = []

    async def work(n: int) -> None:
        with bound(turn_seq=n):
            await asyncio.sleep(0)
            seen.append(context())

    with bound(conversation_id="c-3"):
        await asyncio.gather(work(1), work(2))
        assert context() == {"conversation_id": "c-3"}
    assert sorted(seen, key=lambda c: str(c["turn_seq"])) == [
        {"conversation_id": "c-3", "turn_seq": 1},
        {"conversation_id": "c-3", "turn_seq": 2},
    ]
