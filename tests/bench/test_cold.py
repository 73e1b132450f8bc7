"""The cold-backlog rows' reading of a py-spy profile."""

from __future__ import annotations

from compaction_worker.bench.cold import Drain, _median_run, _Run, import_share

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


def test_a_row_shows_the_run_whose_cold_to_warm_ratio_is_the_median() -> None:
    """Each run compares cold with warm on the same machine moment; the row keeps those pairs together."""
    runs = [
        _Run(Drain(100, 100, None), Drain(400, 400, None)),  # 0.25
        _Run(Drain(900, 900, None), Drain(1000, 1000, None)),  # 0.9
        _Run(Drain(300, 300, None), Drain(600, 600, None)),  # 0.5
    ]
    assert _median_run(runs, lambda d: d.first) is runs[2]
