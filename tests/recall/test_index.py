"""Recall's ranking over plain data: passages, BM25 order, verbatim bounded snippets, the tool's shapes."""

from __future__ import annotations

import json

from compaction_worker.contracts.history import text_with_calls
from compaction_worker.recall.index import Passage, RecallIndex, passages, snippet
from compaction_worker.recall.search import RecallResult
from compaction_worker.recall.tools import ANTHROPIC_TOOL, OPENAI_TOOL, recall_calls, tool_result

LOG = "\n".join(f"2026-11-23T10:00:{k:02d}Z INFO worker-{k % 7} processed batch {k}" for k in range(200))
NEEDLE = "2026-11-23T10:03:20Z ERROR worker-9 lost lease on shard kestrel-42 after 3 retries"


def _index() -> tuple[RecallIndex, str]:
    tool = {"role": "tool", "tool_call_id": "call_0", "content": f"{LOG}\n{NEEDLE}\n{LOG}"}
    call = {
        "role": "assistant",
        "content": "Reading the runbook.",
        "tool_calls": [
            {
                "id": "c",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "ops/runbook-17.md"}'},
            }
        ],
    }
    items = [
        *passages(3, 2, {"role": "user", "content": "The deploy keeps failing on the billing service."}),
        *passages(4, 2, call),
        *passages(5, 2, tool),
        Passage("archive", 2, 5, "artifact", "kestrel-42", artifact_id="host: kestrel-42"),
    ]
    return RecallIndex(items), text_with_calls(tool)


def test_a_long_tool_output_is_cut_into_passages_that_map_back_verbatim() -> None:
    message = {"role": "tool", "tool_call_id": "x", "content": f"{LOG}\n{NEEDLE}"}
    text = text_with_calls(message)
    found = list(passages(7, 3, message, size=500))
    assert len(found) > len(text) // 500
    assert all(len(p.text) <= 500 and text[p.offset : p.offset + len(p.text)] == p.text for p in found)
    assert "".join(p.text for p in found) == text  # nothing skipped, nothing repeated
    assert {(p.n, p.seq, p.role) for p in found} == {(7, 3, "tool")}


def test_the_matching_passage_ranks_first_and_its_snippet_is_verbatim_at_its_offset() -> None:
    index, tool_text = _index()
    hits = index.search("worker lost lease kestrel", 3, snippet_chars=120, max_chars=4000)
    assert hits[0].source == "transcript"
    assert (hits[0].n, hits[0].turn_seq) == (5, 2)
    assert "lost lease" in hits[0].text
    assert len(hits[0].text) <= 120
    assert tool_text[hits[0].offset : hits[0].offset + len(hits[0].text)] == hits[0].text
    assert [h.score for h in hits] == sorted((h.score for h in hits), reverse=True)


def test_archive_hits_carry_the_artifact_id() -> None:
    index, _ = _index()
    hits = index.search("kestrel-42", 5, snippet_chars=600, max_chars=4000)
    archived = [h for h in hits if h.source == "archive"]
    assert [(h.artifact_id, h.text, h.turn_seq) for h in archived] == [("host: kestrel-42", "kestrel-42", 2)]


def test_tool_call_arguments_are_searched() -> None:
    index, _ = _index()
    hits = index.search("runbook-17", 1, snippet_chars=600, max_chars=4000)
    assert hits[0].n == 4
    assert 'read_file({"path": "ops/runbook-17.md"})' in hits[0].text


def test_results_are_bounded_in_count_and_size_and_empty_when_nothing_matches() -> None:
    index, _ = _index()
    hits = index.search("worker batch processed INFO", 20, snippet_chars=300, max_chars=700)
    assert 1 < len(hits) <= 3
    assert sum(len(h.text) for h in hits) <= 700
    assert index.search("worker", 2, snippet_chars=300, max_chars=4000)[1:] != []
    assert len(index.search("worker", 2, snippet_chars=300, max_chars=4000)) == 2
    assert index.search("zebra unicorn", 5, snippet_chars=300, max_chars=4000) == []
    assert index.search("  ", 5, snippet_chars=300, max_chars=4000) == []
    assert RecallIndex([]).search("worker", 5, snippet_chars=300, max_chars=4000) == []


def test_a_snippet_centres_on_the_first_query_term() -> None:
    text = "a" * 1000 + " needle " + "b" * 1000
    start, cut = snippet(text, ["needle"], 200)
    assert "needle" in cut
    assert len(cut) == 200
    assert text[start : start + 200] == cut
    assert snippet("short", ["x"], 200) == (0, "short")


def test_the_tool_definitions_and_reading_a_models_calls() -> None:
    assert OPENAI_TOOL["function"]["name"] == ANTHROPIC_TOOL["name"] == "recall"
    assert OPENAI_TOOL["function"]["parameters"] == ANTHROPIC_TOOL["input_schema"]
    assert ANTHROPIC_TOOL["input_schema"]["required"] == ["query"]
    calls = recall_calls(
        [
            {"id": "a", "function": {"name": "recall", "arguments": '{"query": "lease", "limit": 2}'}},
            {"id": "b", "function": {"name": "bash", "arguments": "{}"}},
            {"id": "c", "function": {"name": "recall", "arguments": "not json"}},
        ]
    )
    assert [(c.id, c.query, c.limit, c.error is None) for c in calls] == [
        ("a", "lease", 2, True),
        ("c", "", None, False),
    ]
    index, _ = _index()
    result = RecallResult(index.search("kestrel-42", 5, snippet_chars=600, max_chars=4000), 1, 3, 1)
    body = json.loads(tool_result(result))
    assert {
        "turn_seq": 2,
        "source": "archive",
        "role": "artifact",
        "artifact_id": "host: kestrel-42",
        "text": "kestrel-42",
    } in body["results"]
    assert "note" in json.loads(tool_result(RecallResult([], 1, 0, 0)))
