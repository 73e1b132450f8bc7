"""The cold-backlog rows' reading of a py-spy profile."""

from __future__ import annotations

from compaction_worker.bench.cold import import_share

_RAW = (
    "<module> (w.py:1);_find_and_load (<frozen importlib._bootstrap>:1176);<module> (litellm/__init__.py:28) 30\n"
    "_loop (compaction_worker/runtime/consumer.py:210);handle (compaction_worker/runtime/turns.py:80) 60\n"
    "_loop (compaction_worker/runtime/consumer.py:210);getmany (aiokafka/consumer.py:1200) 10\n"
)


def test_the_share_in_imports_counts_the_samples_under_importlib() -> None:
    """Samples are weighted by their counts; a stack is in an import if importlib's frame is on it."""
    assert import_share(_RAW) == 0.3


def test_an_empty_profile_has_no_share() -> None:
    """No samples (py-spy missing, or the process gone) is no figure, not zero."""
    assert import_share("") is None
    assert import_share("py-spy> Wrote raw flamegraph data\n") is None
