"""The published contract files in ``schemas/``: rendered from the event and CLI output models, written, checked.

:func:`render_all` is pure and deterministic (same models, byte-identical text);
:func:`write` and :func:`check` are what ``compaction-worker schemas [--check]`` calls. The
AsyncAPI document is passed in: FastStream generates it from the worker's channels, which
are declared above this layer (``runtime/channels.py``).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from compaction_worker.contracts.cli_output import (
    CLI_DIR,
    CLI_GENERATED_NOTE,
    CLI_MODELS,
    cli_schema,
    cli_schema_file,
)
from compaction_worker.contracts.events import EVENT_MODELS
from compaction_worker.contracts.json_schemas import GENERATED_NOTE, event_schema, render_json, schema_file

ASYNCAPI_FILE = "asyncapi.yaml"

_GENERATED_SUFFIXES = (".json", ".yaml", ".yml")


def render_all(asyncapi: str) -> dict[str, str]:
    """Every contract file, as relative path -> exact text (UTF-8, LF, trailing newline).

    The event schemas and the AsyncAPI document (``asyncapi``, its text) at the top, the
    CLI's ``--json`` schemas in ``cli/``.
    """
    files = {schema_file(topic): render_json(event_schema(topic)) for topic in EVENT_MODELS}
    files.update({cli_schema_file(name): render_json(cli_schema(name)) for name in CLI_MODELS})
    files[ASYNCAPI_FILE] = asyncapi
    return dict(sorted(files.items()))


def write(directory: Path, expected: Mapping[str, str]) -> list[Path]:
    """Bring ``directory`` up to date with ``expected`` (:func:`render_all`); return the files written.

    Up-to-date files stay untouched. Stale files that this module generated earlier (an
    event that no longer exists) are removed; files it did not generate are never touched.
    """
    directory.mkdir(parents=True, exist_ok=True)
    written: list[Path] = []
    for name, text in expected.items():
        path = directory / name
        path.parent.mkdir(parents=True, exist_ok=True)
        data = text.encode("utf-8")
        # Bytes, not text mode, so that no platform turns the newlines into something else.
        if not path.is_file() or path.read_bytes() != data:
            path.write_bytes(data)
            written.append(path)
    for stale in _stale_files(directory, expected):
        stale.unlink()
    return written


def check(directory: Path, expected: Mapping[str, str]) -> list[str]:
    """Describe how ``directory`` differs from ``expected`` (:func:`render_all`): missing, different or extra files."""
    problems: list[str] = []
    for name, text in expected.items():
        path = directory / name
        if not path.is_file():
            problems.append(f"{path}: missing")
            continue
        actual = path.read_bytes().decode("utf-8", errors="replace")
        if actual != text:
            problems.append(f"{path}: differs from the models ({_first_difference(actual, text)})")
    problems.extend(f"{path}: extra, no model produces it" for path in _stale_files(directory, expected))
    return problems


def _stale_files(directory: Path, expected: Mapping[str, str]) -> list[Path]:
    stale: list[Path] = []
    for folder, note in ((directory, GENERATED_NOTE), (directory / CLI_DIR, CLI_GENERATED_NOTE)):
        if not folder.is_dir():
            continue
        stale.extend(
            path
            for path in sorted(folder.iterdir())
            if path.is_file()
            and path.relative_to(directory).as_posix() not in expected
            and path.suffix in _GENERATED_SUFFIXES
            and note in path.read_bytes()[:4096].decode("utf-8", errors="replace")
        )
    return stale


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
