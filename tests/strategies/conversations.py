"""Hypothesis strategies for valid conversations, as the store would hold them, and their limits.

:func:`conversations` draws a transcript (users with text and images, assistants with
text or one to three parallel tool calls followed by all their results, tool outputs from
a word to tens of thousands of words, pinned messages, the odd mid-history system message,
and optionally a last assistant message whose tool calls are still unanswered), then
optionally compacts a prefix of it into earlier summary chunks, keeping that prefix's
pinned messages as entries the way a previous compaction would have. The result knows its
transcript, so tests can check where every original message went.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from hypothesis import strategies as st

from compaction_worker.contracts.history import EffectiveHistory, Entry, SummaryChunk
from compaction_worker.contracts.toolpairs import unanswered_calls
from compaction_worker.strategies.draft import Counter, Draft, Limits, StageContext
from compaction_worker.strategies.repair import repair
from compaction_worker.testing import Chat, summary_chunk

from .helpers import GENEROUS, context

TOOLS = ("read_file", "run_command", "search", "skill")
IMAGE_PART = {"type": "image_url", "image_url": {"url": "data:image/png;base64,iVBORw0KGgo="}}
OUTPUT_WORDS = (1, 8, 60, 400, 3_000, 20_000)
"""Tool output sizes in words: tiny to huge (a huge one is far over any tail budget)."""
CallIds = Literal["unique", "per_round", "duplicated"]
"""How tool calls are named: unique across the conversation; ``call_0``, ``call_1``... again
in every round, as runtimes that number calls per turn do; or drawn from ``call_0`` and
``call_1`` alone, so an id also repeats among one message's parallel calls."""
CALL_IDS: tuple[CallIds, ...] = ("unique", "per_round", "duplicated")


@dataclass(frozen=True)
class Conversation:
    """A stored conversation: its effective history and the transcript it stands for."""

    history: EffectiveHistory
    transcript: Mapping[int, Mapping[str, Any]]
    """Every transcript message by ordinal (1-based)."""
    pinned: frozenset[int]
    """Ordinals of the pinned messages."""
    must_keep: frozenset[int]
    """Ordinals no compaction may summarize: pinned messages with their tool pairs, and
    the last assistant message's open calls with the results already in."""

    @property
    def entries(self) -> tuple[Entry, ...]:
        return self.history.entries

    def __repr__(self) -> str:
        # Hypothesis prints failing examples with repr: one short line per message beats
        # pages of lorem ipsum.
        lines = [f"  {describe_chunk(c)}" for c in self.chunks]
        lines += [f"  {describe_entry(e)}" for e in self.entries]
        return "Conversation(\n" + "\n".join(lines) + f"\n  pinned={sorted(self.pinned)})"

    def _repr_pretty_(self, printer: Any, cycle: bool) -> None:
        """What Hypothesis's pretty printer uses (it prefers this to ``__repr__``)."""
        printer.text(repr(self))

    @property
    def chunks(self) -> tuple[SummaryChunk, ...]:
        return self.history.chunks


_LOREM = ["lorem", "ipsum", "dolor", "sit", "amet", "consectetur", "adipiscing", "elit", "sed", "do"]


@functools.cache
def _body(count: int) -> str:
    return " ".join(itertools.islice(itertools.cycle(_LOREM), count))


def describe_entry(entry: Entry) -> str:
    """``#n role [calls] [-> id] tokens flags``: an entry in one line."""
    m = entry.message
    calls = ",".join(str(c.get("id")) for c in m.get("tool_calls") or ())
    parts = [f"#{entry.n}", entry.role]
    if calls:
        parts.append(f"calls[{calls}]")
    if m.get("tool_call_id"):
        parts.append(f"-> {m['tool_call_id']}")
    parts.append(f"{entry.tokens}t")
    if isinstance(m.get("content"), list):
        parts.append("parts")
    if entry.pinned:
        parts.append("PINNED")
    if entry.edit:
        parts.append(f"edit={entry.edit}")
    return " ".join(parts)


def describe_chunk(chunk: SummaryChunk) -> str:
    """A chunk in one line."""
    kept = f" kept={list(chunk.kept)}" if chunk.kept else ""
    return f"chunk {chunk.first_n}-{chunk.last_n}{kept} {chunk.tokens}t {chunk.model}"


def words(count: int, tag: str) -> str:
    """``count`` words starting with ``tag``; cheap even for huge outputs."""
    return f"{tag} {_body(count - 1)}" if count > 1 else tag


class _Knob:
    """Choices decoded from one drawn integer (one draw per message keeps generation fast;
    shrinking the integer to 0 gives the plainest message: short text, not pinned)."""

    def __init__(self, value: int) -> None:
        self.value = value

    def pick(self, options: int) -> int:
        choice = self.value % options
        self.value //= options
        return choice

    def one_in(self, odds: int) -> bool:
        return self.pick(odds) == odds - 1


def _knob(draw: st.DrawFn) -> _Knob:
    return _Knob(draw(st.integers(0, 2**32 - 1)))


_SIZES = (1, 3, 12, 40, 150)
"""Words of a user or assistant text."""


def _user(knob: _Knob, tag: str) -> dict[str, Any]:
    text = words(_SIZES[knob.pick(len(_SIZES))], tag)
    shape = knob.pick(5)  # 0-2: plain text; 3: text then images; 4: images then text
    if shape < 3:
        return {"role": "user", "content": text}
    images = [IMAGE_PART] * (1 + knob.pick(2))
    text_part = {"type": "text", "text": text}
    return {"role": "user", "content": [text_part, *images] if shape == 3 else [*images, text_part]}


@dataclass
class _Builder:
    """Messages in order, with the unit (tool pair group) and turn of each."""

    messages: list[dict[str, Any]]
    units: list[int]
    seqs: list[int]

    def add(self, message: dict[str, Any], unit: int, seq: int, *, pinned: bool = False) -> None:
        if pinned:
            message["pinned"] = True
        self.messages.append(message)
        self.units.append(unit)
        self.seqs.append(seq)


@st.composite
def transcripts(
    draw: st.DrawFn,
    max_turns: int = 8,
    open_end: bool = True,
    max_output_words: int = OUTPUT_WORDS[-1],
    call_ids: CallIds = "unique",
) -> _Builder:
    """Messages of a valid conversation, turn by turn, with units and turn numbers.

    About one text message in ten is pinned, one tool message in 25; a user message may carry images and be followed
    by a system note; an assistant answers directly or after up to three rounds of one
    to three parallel tool calls, each followed by all its results (in any order); with
    ``open_end`` the last round may still wait for some of its results. Call ids: see
    :data:`CallIds`. Parallel calls read different files, so a result judged by another
    call's arguments names the wrong file.
    """
    out = _Builder([], [], [])
    sizes = [w for w in OUTPUT_WORDS if w <= max_output_words]
    unit = itertools.count()
    call_no = itertools.count(1)
    seq = 0
    if draw(st.booleans()):
        seq += 1
        out.add({"role": "system", "content": "You are terse."}, next(unit), seq)
    turns = draw(st.integers(1, max_turns))
    outputs: list[str] = []
    for turn in range(turns):
        seq += 1
        knob = _knob(draw)
        out.add(_user(knob, f"u{turn}"), next(unit), seq, pinned=knob.one_in(10))
        if knob.one_in(12):
            out.add({"role": "system", "content": f"Note {turn}: be careful."}, next(unit), seq)
        seq += 1
        rounds = knob.pick(4)
        ends_open = turn == turns - 1 and open_end and rounds > 0 and knob.one_in(2)
        for r in range(rounds):
            knob = _knob(draw)
            group = next(unit)
            width = 1 + knob.pick(3)
            if call_ids == "per_round":
                call_no = itertools.count()
            if call_ids == "duplicated":
                ids = [f"call_{knob.pick(2)}" for _ in range(width)]
            else:
                ids = [f"call_{next(call_no)}" for _ in range(width)]
            names = [TOOLS[knob.pick(len(TOOLS))] for _ in ids]
            call: dict[str, Any] = {
                "role": "assistant",
                "content": f"Let me check ({turn}.{r})." if knob.one_in(2) else None,
                "tool_calls": [
                    {
                        "id": i,
                        "type": "function",
                        "function": {"name": name, "arguments": f'{{"path": "src/m{(turn + k) % 3}.py"}}'},
                    }
                    for k, (i, name) in enumerate(zip(ids, names, strict=True))
                ],
            }
            # Pinning a call keeps its results, huge ones too: rarer, or most targets are out of reach.
            out.add(call, group, seq, pinned=knob.one_in(25))
            order = list(range(len(ids)))
            # Results may come back in any order, except where ids repeat within the round:
            # then only their order tells them apart.
            if knob.one_in(2) and len(set(ids)) == len(ids):
                order.reverse()
            answered = len(ids)
            if ends_open and r == rounds - 1:
                answered = knob.pick(len(ids))
            for k in order[:answered]:
                knob = _knob(draw)
                size = sizes[knob.pick(len(sizes))]
                # Repeats of an earlier output exercise de-duplication.
                if outputs and knob.one_in(5):
                    content = outputs[knob.pick(len(outputs))]
                else:
                    content = words(size, f"o{ids[k]}")
                outputs.append(content)
                result: dict[str, Any] = {"role": "tool", "tool_call_id": ids[k], "content": content}
                if knob.one_in(4):
                    result["name"] = names[k]
                out.add(result, group, seq, pinned=knob.one_in(25))
        if not ends_open:
            knob = _knob(draw)
            answer = {"role": "assistant", "content": words(_SIZES[knob.pick(len(_SIZES))], f"a{turn}")}
            out.add(answer, next(unit), seq, pinned=knob.one_in(10))
    return out


def _open_unit(built: _Builder) -> set[int]:
    """Indexes of the trailing tool-calling message with unanswered calls and its results."""
    last = max((i for i, m in enumerate(built.messages) if m["role"] not in ("tool", "system")), default=-1)
    if last < 0 or not built.messages[last].get("tool_calls"):
        return set()
    if not unanswered_calls(built.messages[last:]):
        return set()
    return {i for i in range(last, len(built.messages)) if built.units[i] == built.units[last]}


def stage_context(counter: Counter, limits: Limits | None = None, **settings: Any) -> StageContext:
    """A stage context for ``counter`` (limits no stage has to work for, unless given)."""
    return context(counter=counter, limits=limits or GENEROUS, **settings)


def _chunk(first: int, last: int, seqs: Sequence[int], kept: Sequence[int], counter: Counter) -> SummaryChunk:
    chunk = summary_chunk(
        first,
        last,
        f"## Current state\n- Messages {first} to {last} were about the repository layout.",
        id=f"earlier-{first}-{last}",
        first_seq=seqs[first - 1],
        last_seq=seqs[last - 1],
        model="earlier",
        kept=tuple(n for n in kept if first <= n <= last),
    )
    return replace(chunk, tokens=counter.text(chunk.render_text()))


@st.composite
def conversations(
    draw: st.DrawFn,
    counter: Counter,
    *,
    max_turns: int = 8,
    earlier_summaries: bool = True,
    open_end: bool = True,
    start: int = 1,
    max_output_words: int = OUTPUT_WORDS[-1],
    call_ids: CallIds = "unique",
) -> Conversation:
    """A valid stored conversation; ordinals start at ``start`` (to append to another)."""
    built = draw(
        transcripts(
            max_turns=max_turns, open_end=open_end, max_output_words=max_output_words, call_ids=call_ids
        )
    )
    # Appended conversations continue the turn numbers too (a turn adds at least one message).
    chat = Chat(start, counter)
    for m, s in zip(built.messages, built.seqs, strict=True):
        chat.add(m, seq=start - 1 + s)
    entries = chat.entries
    # A system message is pinned as if the runtime had marked it (Entry.pinned).
    pinned_units = {
        u
        for u, m in zip(built.units, built.messages, strict=True)
        if m.get("pinned") or m["role"] == "system"
    }
    must_keep = {i for i, u in enumerate(built.units) if u in pinned_units} | _open_unit(built)
    chunks: list[SummaryChunk] = []
    users = [i for i, m in enumerate(built.messages) if m["role"] == "user" and i > 0]
    if earlier_summaries and start == 1 and users and draw(st.booleans()):
        # An earlier compaction summarized everything before a user message, keeping
        # the pinned messages (with their pairs) of that span as entries.
        cut = draw(st.sampled_from(users))
        kept = [start + i for i in range(cut) if i in must_keep]
        middle = draw(st.integers(1, cut))
        spans = [(1, cut)] if middle == cut or draw(st.booleans()) else [(1, middle), (middle + 1, cut)]
        chunks = [_chunk(a, b, built.seqs, kept, counter) for a, b in spans]
        entries = [e for e in entries if e.n > cut or e.n in kept]
    draft = Draft(tuple(chunks), tuple(entries))
    if chunks:
        # As the previous compaction committed it: repaired (kept pinned messages can
        # meet at the junctions it created).
        draft = repair(draft, stage_context(counter)).draft
    return Conversation(
        history=EffectiveHistory(chunks=draft.chunks, entries=draft.entries),
        transcript={start + i: m for i, m in enumerate(built.messages)},
        pinned=frozenset(start + i for i, m in enumerate(built.messages) if m.get("pinned")),
        must_keep=frozenset(start + i for i in must_keep),
    )


@st.composite
def limits_for(draw: st.DrawFn, tokens: int) -> Limits:
    """Limits for a history of ``tokens``: a target anywhere from far below it to above it."""
    fixed = draw(st.sampled_from((0, 0, 40, 300, 2_000)))
    target = fixed + max(1, int(tokens * draw(st.sampled_from((0.02, 0.1, 0.3, 0.5, 0.8, 1.2)))))
    window = int(target * draw(st.sampled_from((1.25, 2.0, 4.0))))
    return Limits(
        target=target,
        fixed_tokens=fixed,
        window=window,
        tail_max_messages=draw(st.integers(1, 12)),
        tail_max_tokens=int(window * draw(st.sampled_from((0.02, 0.1, 0.25, 0.5)))),
        max_summary_tokens=draw(st.sampled_from((64, 256, 2_048))),
        chunk_budget=int(target * draw(st.sampled_from((0.05, 0.2, 0.5)))),
        force=draw(st.integers(0, 7)) == 0,
        # The task kept whole, within a share of the window, or summarized like any message.
        task_max_tokens=draw(st.sampled_from((0, int(window * 0.2), 10**6))),
    )


EDITS = frozenset({"pruned", "deduplicated", "truncated"})
"""Non-LLM edits that may replace a message's content with a placeholder or an excerpt."""


def coverage_problems(
    conversation: Conversation,
    chunks: Sequence[SummaryChunk],
    entries: Sequence[Entry],
    *,
    task_max_tokens: int = 0,
) -> list[str]:
    """Ways a compacted history fails to account for every original message exactly once.

    Each transcript ordinal must be either one entry (verbatim, or edited by a cheap stage
    keeping its role and tool pairing) or covered by one chunk; pinned messages must be
    verbatim entries (one over ``task_max_tokens`` may be cut to it, unless it is a system
    message); entries that stand for no ordinal must be marked synthetic (or restored: the
    working state, see strategies.working_state; or standing: strategies.standing_state).
    """
    sizes = {e.n: e.tokens for e in conversation.entries}
    cut_before = {e.n for e in conversation.entries if e.edit == "truncated"}
    problems: list[str] = []
    where: dict[int, list[str]] = {n: [] for n in conversation.transcript}
    for chunk in chunks:
        for n in range(chunk.first_n, chunk.last_n + 1):
            if chunk.covers(n):
                where.setdefault(n, []).append(f"chunk {chunk.id}")
    for entry in entries:
        if entry.n == 0:
            if entry.edit not in ("synthetic", "restored", "standing"):
                problems.append(
                    f"entry with ordinal 0 not marked synthetic, restored or standing: {entry.message}"
                )
            continue
        where.setdefault(entry.n, []).append("entry")
        original = conversation.transcript.get(entry.n)
        if original is None:
            continue
        if entry.edit is None:
            if entry.message != original:
                problems.append(f"message {entry.n} changed without an edit mark")
        elif entry.edit in EDITS:
            for key in ("role", "tool_call_id", "tool_calls"):
                if entry.message.get(key) != original.get(key):
                    problems.append(f"edited message {entry.n} changed its {key}")
        else:
            problems.append(f"message {entry.n} has unknown edit {entry.edit!r}")
        cut_to_budget = (
            entry.edit == "truncated"
            and original.get("role") != "system"
            and (entry.n in cut_before or 0 < task_max_tokens < sizes.get(entry.n, 0))
        )
        if (
            entry.n in conversation.pinned
            and not cut_to_budget
            and (entry.edit is not None or entry.message != original)
        ):
            problems.append(f"pinned message {entry.n} is not verbatim (edit {entry.edit!r})")
    for n, places in sorted(where.items()):
        if n not in conversation.transcript:
            problems.append(f"ordinal {n} is in no transcript but in {places}")
        elif len(places) != 1:
            problems.append(f"message {n} is in {places or 'nothing'}, not exactly once")
        elif n in conversation.pinned and places != ["entry"]:
            problems.append(f"pinned message {n} is summarized")
    return problems
