"""Positional tool pairing (toolpairs.py): a result answers the nearest preceding issuer of its id."""

from __future__ import annotations

import json
from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from compaction_worker.contracts.toolpairs import (
    ToolCall,
    issued_calls,
    pair_results,
    pairing,
    result_id,
    tool_pairs,
    unanswered_calls,
)


def user(text: str = "go on") -> dict[str, Any]:
    return {"role": "user", "content": text}


def calls(*specs: tuple[str, str]) -> dict[str, Any]:
    """An assistant message calling ``read_file`` on (id, path) pairs, in parallel."""
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": i,
                "type": "function",
                "function": {"name": "read_file", "arguments": json.dumps({"path": p})},
            }
            for i, p in specs
        ],
    }


def result(call_id: str, content: str = "output") -> dict[str, Any]:
    return {"role": "tool", "tool_call_id": call_id, "content": content}


def path_of(call: ToolCall) -> str:
    return str(json.loads(call.arguments)["path"])


class TestIssuedCalls:
    def test_fields_in_order(self) -> None:
        """Each call knows its id, tool, raw arguments, owner index and slot."""
        got = issued_calls(calls(("call_0", "a.py"), ("call_1", "b.py")), 4)
        assert got == (
            ToolCall("call_0", "read_file", '{"path": "a.py"}', 4, 0),
            ToolCall("call_1", "read_file", '{"path": "b.py"}', 4, 1),
        )

    def test_dict_arguments_and_flat_calls(self) -> None:
        """Arguments given as an object become sorted JSON; a call without ``function`` is read flat."""
        message = {
            "role": "assistant",
            "tool_calls": [
                {"id": "x", "function": {"name": "run", "arguments": {"b": 1, "a": 2}}},
                {"id": "y", "name": "flat", "arguments": None},
                "garbage",
            ],
        }
        got = issued_calls(message, 0)
        assert [(c.id, c.name, c.arguments, c.slot) for c in got] == [
            ("x", "run", '{"a": 2, "b": 1}', 0),
            ("y", "flat", "", 1),
        ]

    def test_only_assistants_issue_calls(self) -> None:
        """A tool_calls field on another role issues nothing."""
        assert issued_calls({"role": "user", "tool_calls": [{"id": "x"}]}, 0) == ()
        assert issued_calls({"role": "assistant", "content": "hi"}, 0) == ()

    def test_result_id(self) -> None:
        assert result_id(result("call_7")) == "call_7"


class TestPairing:
    def test_ids_reused_every_turn_pair_with_their_own_turn(self) -> None:
        """The bug of issue 9: with call_0/call_1 in every turn, an id-keyed lookup gave every
        result the latest turn's call; by position each result gets its own turn's call."""
        messages = [
            user(),
            calls(("call_0", "/src/a.py"), ("call_1", "/src/b.py")),
            result("call_0", "A"),
            result("call_1", "B"),
            user(),
            calls(("call_0", "/src/b.py"), ("call_1", "/src/c.py")),
            result("call_1", "C"),
            result("call_0", "B again"),
        ]
        paired = pair_results(messages)
        assert {i: (c.owner, path_of(c)) for i, c in paired.items()} == {
            2: (1, "/src/a.py"),
            3: (1, "/src/b.py"),
            6: (5, "/src/c.py"),
            7: (5, "/src/b.py"),
        }
        assert tool_pairs(messages) == [(1, 2), (1, 3), (5, 6), (5, 7)]

    def test_parallel_calls_sharing_an_id_are_matched_in_order(self) -> None:
        """Two calls named call_0 in one message: the first result answers the first, and so on."""
        messages = [user(), calls(("call_0", "a.py"), ("call_0", "b.py")), result("call_0"), result("call_0")]
        paired = pair_results(messages)
        assert [(paired[i].slot, path_of(paired[i])) for i in (2, 3)] == [(0, "a.py"), (1, "b.py")]

    def test_a_late_result_answers_the_nearest_issuer(self) -> None:
        """A result that comes after other messages still answers the latest message that issued its id."""
        messages = [user(), calls(("x", "a.py")), user(), {"role": "assistant", "content": "hm"}, result("x")]
        assert pair_results(messages)[4].owner == 1

    def test_a_later_issuer_takes_over_the_id(self) -> None:
        """Once another message issues the id, results answer it, even if the first call is unanswered."""
        messages = [user(), calls(("x", "a.py")), user(), calls(("x", "b.py")), result("x")]
        assert pair_results(messages)[4].owner == 3
        assert [(c.owner, c.slot) for c in unanswered_calls(messages)] == [(1, 0)]

    def test_orphans_are_absent(self) -> None:
        """A result whose id nobody issued, and a second result for an answered call, answer nothing:
        neither is attached to an older call that happens to share the id."""
        messages = [
            user(),
            calls(("x", "a.py")),
            result("x"),
            result("x"),
            result("nobody"),
            calls(("x", "b.py")),
            result("x"),
            result("x"),
        ]
        assert sorted(pair_results(messages)) == [2, 6]
        assert unanswered_calls(messages) == ()

    def test_unanswered_calls_in_order(self) -> None:
        messages = [user(), calls(("a", "1"), ("b", "2"), ("a", "3")), result("a"), user()]
        assert [(c.id, c.slot) for c in unanswered_calls(messages)] == [("b", 1), ("a", 2)]

    def test_pairing_reports_every_call(self) -> None:
        messages = [user(), calls(("a", "1")), result("a"), calls(("a", "2"))]
        p = pairing(messages)
        assert [c.owner for c in p.calls] == [1, 3]
        assert {(c.owner, c.slot) for c in p.results.values()} == {(1, 0)}
        assert tool_pairs(messages) == [(1, 2)]


@st.composite
def histories(draw: st.DrawFn) -> list[dict[str, Any]]:
    """Turns of parallel calls with ids drawn from a tiny pool, results in slot order."""
    messages: list[dict[str, Any]] = [user()]
    for turn in range(draw(st.integers(1, 6))):
        ids = draw(st.lists(st.sampled_from(["call_0", "call_1"]), min_size=1, max_size=3))
        messages.append(calls(*((i, f"t{turn}s{k}") for k, i in enumerate(ids))))
        answered = draw(st.integers(0, len(ids)))
        messages += [result(i, f"t{turn}s{k}") for k, i in enumerate(ids[:answered])]
        if draw(st.booleans()):
            messages.append(user())
    return messages


@given(histories())
def test_every_result_answers_its_own_call(messages: list[dict[str, Any]]) -> None:
    """Results in slot order after their own message pair with exactly that call, each slot once."""
    paired = pair_results(messages)
    tool_indexes = [i for i, m in enumerate(messages) if m["role"] == "tool"]
    assert sorted(paired) == tool_indexes
    for i, call in paired.items():
        assert path_of(call) == messages[i]["content"]
        assert messages[call.owner]["role"] == "assistant"
        assert all(m["role"] == "tool" for m in messages[call.owner + 1 : i])
    assert len({(c.owner, c.slot) for c in paired.values()}) == len(paired)
    assert len(unanswered_calls(messages)) == len(pairing(messages).calls) - len(paired)
