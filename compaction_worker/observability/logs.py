"""Logging set-up, and the context every line carries: short lines for people, JSON for machines.

What a piece of work is about (the conversation, the turn, the compaction job) is bound once,
where the work starts (:func:`bound`), in a context variable: every record logged inside it,
by any module and any task started from it, carries those fields, without ``extra=`` at each
call (structlog's ``contextvars`` binding, on the standard library).
"""

from __future__ import annotations

import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from contextvars import ContextVar
from datetime import UTC, datetime

_STANDARD = set(logging.LogRecord("", 0, "", 0, "", (), None).__dict__) | {"message", "asctime"}

_CONTEXT: ContextVar[dict[str, object]] = ContextVar("compaction_worker_log_context", default={})  # noqa: B039  # never mutated: bound() sets a new dict


@contextlib.contextmanager
def bound(**fields: object) -> Iterator[None]:
    """Add ``fields`` (e.g. ``conversation_id``, ``turn_seq``, ``job``) to every record logged in the block."""
    token = _CONTEXT.set({**_CONTEXT.get(), **{k: v for k, v in fields.items() if v is not None}})
    try:
        yield
    finally:
        _CONTEXT.reset(token)


def context() -> dict[str, object]:
    """The fields bound where this runs."""
    return dict(_CONTEXT.get())


class ContextFilter(logging.Filter):
    """Sets the bound fields on each record (an ``extra=`` field of the same name wins)."""

    def filter(self, record: logging.LogRecord) -> bool:
        for name, value in _CONTEXT.get().items():
            if not hasattr(record, name):
                setattr(record, name, value)
        return True


def _fields(record: logging.LogRecord) -> dict[str, object]:
    return {k: v for k, v in record.__dict__.items() if k not in _STANDARD}


class TextFormatter(logging.Formatter):
    """``12:00:00 INFO    logger: message  conversation_id=c turn_seq=3``."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s", "%H:%M:%S")

    def format(self, record: logging.LogRecord) -> str:
        text = super().format(record)
        fields = _fields(record)
        if not fields:
            return text
        line, newline, rest = text.partition("\n")  # the fields go on the message's line, before a traceback
        return f"{line}  " + " ".join(f"{k}={v}" for k, v in fields.items()) + newline + rest


class JsonFormatter(logging.Formatter):
    """One JSON object per record, with the bound fields (and any ``extra=`` ones) kept."""

    def format(self, record: logging.LogRecord) -> str:
        data: dict[str, object] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        data.update(_fields(record))
        if record.exc_info:
            data["exc"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


def configure_logging(level: str = "INFO", json_lines: bool = False) -> None:
    """Configure the root logger once for the process (the CLI calls this)."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if json_lines else TextFormatter())
    handler.addFilter(ContextFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level)
    # Libraries that are chatty at INFO.
    for name in ("aiokafka", "LiteLLM", "litellm", "httpx", "faststream"):
        logging.getLogger(name).setLevel(max(logging.WARNING, root.level))
