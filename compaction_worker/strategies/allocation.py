"""How the room under the target is divided when a summary is written, and what gives way first.

The room (the target less the system prompt and tools, and less the standing state's
reservation, which the pipeline takes first) holds, in this order of precedence:

1. the system messages and the runtime's pinned messages: never cut here;
2. the earlier summary chunks that stay (a fold rewrites them when they outgrow their budget);
3. the new summary, with its ledger: its floor (:func:`summary_floor`), so that no summary is
   asked to fit in a handful of tokens;
4. the task, the user's recent words and the verbatim tail (at least the newest step, cut if
   it must be, never summarized). When they and the summary's floor do not fit, what gives
   way, first to last: the user's older words and the tail's older steps, in proportion; the
   newest step's bulk (cut to a head and a tail); the summary, down to :data:`MIN_FLOOR`; the
   task (cut to a head and a tail that carry its distinctive terms). :func:`allocate`.

A run that still cannot reach its target aims at the ceilings (``strategies.pipeline.compact``)
and says so.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SUMMARY_FLOOR_SHARE = 0.15
"""The summary's floor, as a share of the free room (at least ``MIN_FLOOR`` tokens, at most its reserve)."""
MIN_FLOOR = 64
KEEP_FLOORS = (0.1, 0.25)
"""The shares of what they hold that the user's words and the tail keep while the summary's floor
allows it: the tail a quarter (the newest step, cut), the words a tenth (the standing state keeps
what they set, word for word)."""


@dataclass(frozen=True, slots=True)
class Keeps:
    """Tokens kept verbatim beside the summary, by part."""

    task: int
    user_words: int
    tail: int

    @property
    def total(self) -> int:
        return self.task + self.user_words + self.tail


def summary_floor(free: int, reserve: int) -> int:
    """The least a new summary (with its ledger) is given: a share of what is ``free`` for it and the
    verbatim parts (the room less the system messages, pinned messages and the chunks that stay),
    within its reserve."""
    return min(reserve, max(MIN_FLOOR, int(SUMMARY_FLOOR_SHARE * free)))


def allocate(free: int, wants: Keeps, floor: int, *, last_aim: bool = True) -> Keeps:
    """What the task, the user's words and the tail may keep of ``free`` (the room less what is never
    cut here) so that the summary gets ``floor``; what gives way, first to last:

    1. the user's words and the tail, in proportion to what each holds above its floor
       (:data:`KEEP_FLOORS`);
    2. those floors, in proportion (the newest step is then cut as far as cutting goes);
    3. the summary's floor, down to :data:`MIN_FLOOR`;
    4. the task, only on the ``last_aim`` (a run with a higher ceiling left aims there first,
       ``strategies.pipeline``, rather than cut the statement of the work).
    """
    if wants.total + floor <= free:
        return wants
    words, tail = wants.user_words, wants.tail
    low_words, low_tail = int(KEEP_FLOORS[0] * words), int(KEEP_FLOORS[1] * tail)
    others = free - floor - wants.task  # what the words and the tail may take together
    if others >= low_words + low_tail:
        share = (words + tail - others) / max(1, words - low_words + tail - low_tail)
        return Keeps(
            wants.task,
            words - math.ceil(share * (words - low_words)),
            tail - math.ceil(share * (tail - low_tail)),
        )
    if others > 0:
        share = others / (low_words + low_tail)
        return Keeps(wants.task, int(share * low_words), int(share * low_tail))
    if not last_aim:
        return Keeps(wants.task, 0, 0)
    least = min(floor, MIN_FLOOR)
    return Keeps(max(0, min(wants.task, free - least)), 0, 0)
