"""Pin (or unpin) a message after the turn that sent it: ``Client.pin`` / ``Client.unpin``.

A pinned message is kept verbatim by every compaction path (the pipeline reads the
message's ``pinned`` field, as for a message the runtime pinned when it published it). The
flag is written on the message's entry in the effective history, under the conversation's
lock: a compaction running at that moment would commit a history read before the pin, so the
pin waits for it instead (LockNotAcquiredError: try again). Only a message the effective
history still carries can be pinned; one a summary already replaced cannot (rewind first), and
one a cheap stage edited (a pruned tool output) stays pinned as the history holds it.

A runtime that only publishes pins with a turn's ``pin`` / ``unpin`` fields: the turn's append
adds them to the meta's ``pins`` (runtime/plan.py), and whoever holds the lock next applies
them (:func:`apply_asked`): the turn handler right after the append when no compaction runs,
else that compaction, before it reads the history.
"""

from __future__ import annotations

import json
import logging

from compaction_worker.errors import PinError, StaleFenceError
from compaction_worker.state.lock import Locks
from compaction_worker.state.meta import clear_field_if
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)


async def set_pinned(
    store: Store, locks: Locks, conversation_id: str, turn_seq: int, *, index: int | None, pinned: bool
) -> list[int]:
    """Pin (``pinned``) or unpin the messages of turn ``turn_seq`` (only its ``index``-th, from 0,
    when given); returns their transcript ordinals."""
    ordinals = await _ordinals(store, conversation_id, turn_seq, index)
    async with locks.exclusive(conversation_id, store.keys(conversation_id)):
        await _write(store, conversation_id, turn_seq, ordinals, pinned=pinned)
    return ordinals


async def apply_asked(store: Store, locks: Locks | None, conversation_id: str, asked: str) -> bool:
    """Apply the pins turns asked for (the meta's ``pins``, ``asked``) and clear them; with ``locks``,
    only if the conversation's lock is free now (None: the caller holds it). A pin of a message a
    summary already replaced, or of no such message, is logged and dropped. Whether they were applied."""
    if locks is None:
        await _apply(store, conversation_id, asked)
        return True
    async with locks.held(conversation_id, store.keys(conversation_id)) as lease:
        if lease is None:
            return False  # the compaction running now applies them first
        await _apply(store, conversation_id, asked)
    return True


async def _apply(store: Store, conversation_id: str, asked: str) -> None:
    for turn_seq, index, pinned in json.loads(asked):
        try:
            ordinals = await _ordinals(store, conversation_id, turn_seq, index)
            await _write(store, conversation_id, turn_seq, ordinals, pinned=pinned)
        except PinError as e:
            log.warning(
                "a turn's %s of turn %s was not applied: %s", "pin" if pinned else "unpin", turn_seq, e
            )
        except StaleFenceError as e:  # the lock expired, and another holder changed the history
            log.warning("pins asked were not applied (%s): the next holder of the lock applies them", e)
            return
    # Only what was read: pins a turn added meanwhile stay for the next holder of the lock.
    await clear_field_if(store.redis, store.keys(conversation_id).meta, "pins", asked)


async def _ordinals(store: Store, conversation_id: str, turn_seq: int, index: int | None) -> list[int]:
    """The transcript ordinals of turn ``turn_seq``'s messages (its ``index``-th only, when given)."""
    ordinals = [
        record["n"] for record in await store.transcript(conversation_id) if record.get("seq") == turn_seq
    ]
    if not ordinals:
        raise PinError(f"{conversation_id} has no turn {turn_seq}")
    if index is not None:
        if not 0 <= index < len(ordinals):
            raise PinError(
                f"turn {turn_seq} of {conversation_id} has {len(ordinals)} messages, no index {index}"
            )
        ordinals = [ordinals[index]]
    return ordinals


async def _write(
    store: Store, conversation_id: str, turn_seq: int, ordinals: list[int], *, pinned: bool
) -> None:
    """Set the flag on the entries of ``ordinals``; the conversation's lock is held."""
    gone = await store.set_pinned(conversation_id, ordinals, pinned)
    if gone:
        raise PinError(
            f"message {', '.join(map(str, gone))} of {conversation_id} (turn {turn_seq}) is already "
            "summarized: rewind the compaction that replaced it first"
        )
