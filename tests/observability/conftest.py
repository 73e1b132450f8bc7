"""The observability tests' fixture: the process's in-memory OpenTelemetry providers, cleared."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.observability.memory import Memory, memory


@pytest.fixture
def telemetry() -> Iterator[Memory]:
    """In-memory span exporter and metric reader, installed once per process, empty for this test."""
    with memory().recording() as installed:
        yield installed
