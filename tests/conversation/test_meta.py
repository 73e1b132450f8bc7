"""The meta as a value: one made from another (the per-turn path makes one a turn)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from compaction_worker.contracts.events import ContextStatus
from compaction_worker.conversation.meta import Meta


def test_changed_is_what_replace_makes_for_every_field() -> None:
    """Each field changed alone, and several at once, give what dataclasses.replace gives; the original is untouched."""
    meta = Meta(last_seq=4, model="m", tools=({"name": "read"},), calibration=1.1)
    values: dict[str, Any] = {
        "last_seq": 5,
        "msg_count": 9,
        "model": "other",
        "context_status": ContextStatus.SUMMARIZED,
        "calibration": 0.9,
        "tools": None,
        "system_prompt": "be brief",
        "observed_window": 4096,
        "updated_at": 1764000000.5,
        "rev": 7,
    }
    for field in dataclasses.fields(Meta):
        value: Any = values.get(field.name, 123 if field.type in ("int", "int | None") else "x")
        assert meta.changed({field.name: value}) == dataclasses.replace(meta, **{field.name: value})
    assert meta.changed(values, rev=8) == dataclasses.replace(meta, **{**values, "rev": 8})
    assert meta == Meta(last_seq=4, model="m", tools=({"name": "read"},), calibration=1.1)


def test_changed_refuses_a_name_that_is_no_field() -> None:
    with pytest.raises(KeyError):
        Meta().changed({"last_sequence": 3})
