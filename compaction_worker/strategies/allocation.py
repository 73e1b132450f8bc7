"""What stays when not everything fits: one order of value, and one packing of the room by it.

Invariant 13. When a compaction cannot keep everything under its target, what stays is decided
by value, in this order (:class:`Tier`):

1. what a commit cannot do without: system messages, the runtime's pinned messages, the task's
   statement (its head, :data:`TASK_HEAD_TOKENS`, when it must be cut), the summary turn and the
   least summary worth writing (:data:`MIN_FLOOR`);
2. the rules and constraints the user set (the standing state);
3. the current goals and decisions (the standing state);
4. the agent's newest step (its last action and result, cut if it must be, never summarized);
5. the preferences and facts the user stated (the standing state), and the identifiers the
   summary's ledger keeps;
6. the task's bulk and the user's recent words;
7. the summary's narrative and the older tail;
8. filler: acknowledgments and remarks that state nothing needed, which give way first (they are
   never offered: ``summaries.sentences.is_filler``).

:func:`pack` grants the room tier by tier; within a tier, whole parts cheapest first (value per
token), then the parts that can be cut share what is left in proportion to their size. The
pipeline packs the standing state's items by it before any stage runs
(``strategies.standing_state``); the summary stage packs the rest of the room by it
(:func:`allocate`); the commit puts the state back in the same order (``summaries.standing.render``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class Tier(IntEnum):
    """The order of value: the lower, the earlier a part is given room (docs/design.md)."""

    REQUIRED = 0
    RULES = 1
    GOALS = 2
    STEP = 3
    FACTS = 4
    BULK = 5
    NARRATIVE = 6


@dataclass(frozen=True, slots=True)
class Part:
    """Something that asks for room: its name, its tier and what it costs whole."""

    name: str
    tier: Tier
    cost: int
    divisible: bool = False
    """It can be cut to fit (a message to a head and a tail, a tail to its newer steps): it takes
    what is left when its whole cost does not fit. Otherwise all or nothing."""


def pack(parts: Sequence[Part], room: int) -> dict[str, int]:
    """The tokens each part keeps of ``room``: tier by tier; within a tier the whole parts cheapest
    first (a part that does not fit is passed over for cheaper ones), then the divisible parts, which
    share what is left in proportion to their costs."""
    grants = dict.fromkeys((p.name for p in parts), 0)
    left = max(0, room)
    for tier in sorted({p.tier for p in parts}):
        members = [p for p in parts if p.tier == tier]
        for part in sorted((p for p in members if not p.divisible), key=lambda p: p.cost):
            if part.cost <= left:
                grants[part.name] = part.cost
                left -= part.cost
        shared = [p for p in members if p.divisible and p.cost > 0]
        wanted = sum(p.cost for p in shared)
        for part in shared:
            grants[part.name] = part.cost if wanted <= left else part.cost * left // wanted
        left -= sum(grants[p.name] for p in shared)
    return grants


MIN_SUMMARY_TOKENS = 32
"""Below this much room a summary's text is not worth an LLM call."""
MIN_FLOOR = 48
"""The least a new summary (heading and text) is given: below it no summary says anything
(:data:`MIN_SUMMARY_TOKENS` of text, and its heading)."""
TASK_HEAD_TOKENS = 64
"""The task's statement when it must be cut and has no sentence that asks for work: its head (with its
distinctive terms) is kept whatever else gives way (invariant 10); the rest of it ranks with the
user's recent words. A task that asks is cut to the sentences that ask (``oversized.statement``)."""


@dataclass(frozen=True, slots=True)
class Keeps:
    """Tokens kept verbatim beside the summary, by part."""

    task: int
    user_words: int
    tail: int

    @property
    def total(self) -> int:
        return self.task + self.user_words + self.tail


@dataclass(frozen=True, slots=True)
class Wants:
    """What the verbatim parts beside a new summary hold whole, and what the summary asks for."""

    keeps: Keeps
    step: int
    """Tokens of the newest step, the end of the tail (0: none worth keeping)."""
    summary: int
    """What the new chunk may take (its reserve: narrative and ledger)."""
    ledger: int = 0
    """Of ``summary``, what its ledger of identifiers may take."""
    filler: int = 0
    """Tokens at the end of the tail that say nothing (acknowledgments): they give way first."""
    statement: int = 0
    """Tokens of the task cut to its statement (the sentences that ask for work); 0: unknown."""


def allocate(free: int, wants: Wants, *, last_aim: bool = True) -> Keeps:
    """What the task, the user's words and the tail may keep of ``free`` (the room less what is never
    cut here), by :func:`pack` in the order of value: the summary's floor and the task (whole until the
    ``last_aim``: a run with a higher ceiling left aims there first rather than cut the statement of
    the work; on it, its head, and its bulk ranks with the user's words), the newest step, the ledger,
    the user's words, then the summary's narrative and the tail's older steps.
    """
    keeps = wants.keeps
    floor = min(wants.summary, MIN_FLOOR)  # the least a new summary is given, within its reserve
    if keeps.total + wants.summary <= free:
        return keeps
    if free < floor:
        return Keeps(keeps.task, 0, 0)  # no room for a summary at all: the stage says so
    head = min(keeps.task, wants.statement or TASK_HEAD_TOKENS)
    step = min(wants.step, keeps.tail)
    ledger = min(wants.ledger, max(0, wants.summary - floor))
    parts = [
        Part("summary", Tier.REQUIRED, floor),
        Part("task", Tier.REQUIRED, keeps.task, divisible=False)
        if not last_aim
        else Part("task", Tier.REQUIRED, head, divisible=True),
        Part("step", Tier.STEP, step, divisible=True),
        Part("ledger", Tier.FACTS, ledger, divisible=True),
        Part("task bulk", Tier.BULK, keeps.task - head if last_aim else 0, divisible=True),
        Part("words", Tier.BULK, keeps.user_words, divisible=True),
        Part("narrative", Tier.NARRATIVE, max(0, wants.summary - floor - ledger), divisible=True),
        Part("older tail", Tier.NARRATIVE, max(0, keeps.tail - step - wants.filler), divisible=True),
    ]
    grants = pack(parts, free)
    if not last_aim and grants["task"] < keeps.task:
        return Keeps(keeps.task, 0, 0)  # no room beside the whole task: the run aims higher
    return Keeps(
        grants["task"] + grants["task bulk"],
        grants["words"],
        grants["step"] + grants["older tail"],
    )
