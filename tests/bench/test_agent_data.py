"""The bench's agent-shaped conversations."""

from __future__ import annotations

from compaction_worker.bench import agent_data


def test_sizes_are_labelled_as_the_table_names_them() -> None:
    assert [agent_data.label(n) for n in (800, 1_000, 100_000, 1_000_000, 1_500_000)] == [
        "800",
        "1K",
        "100K",
        "1M",
        "1.5M",
    ]


def test_agent_turns_reuse_call_ids_and_a_salt_makes_them_a_conversations_own() -> None:
    turn = agent_data.agent_turn(3, "a")
    assert [m["role"] for m in turn] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [c["id"] for c in turn[1]["tool_calls"]] == ["call_0", "call_1"]
    assert [c["id"] for c in agent_data.agent_turn(4)[1]["tool_calls"]] == ["call_0", "call_1"]
    assert all(len(m["content"]) > 1000 for m in turn[2:4])  # tool outputs of a few KB
    other = agent_data.agent_turn(3, "b")
    assert all(
        m["content"] != o["content"] for m, o in zip(turn, other, strict=True) if m["role"] != "assistant"
    )
