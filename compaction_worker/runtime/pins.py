"""Pin (or unpin) a message after the turn that sent it: ``Client.pin`` / ``Client.unpin``.

A pinned message is kept verbatim by every compaction path (the pipeline reads the
message's ``pinned`` field, as for a message the runtime pinned when it published it). The
flag is written on the message's entry in the effective history, under the conversation's
lock: a compaction running at that moment would commit a history read before the pin, so the
pin waits for it instead (LockNotAcquiredError: try again). Only a message the effective
history still carries can be pinned; one a summary already replaced cannot (rewind first), and
one a cheap stage edited (a pruned tool output) stays pinned as the history holds it.

A runtime that only publishes pins with a turn's ``pin`` / ``unpin`` fields: the turn's append
adds them to the meta's ``pins``, in the same write, O(1) (conversation/decide.py), and the next
holder of the lock applies them (:func:`apply_asked`): the next compaction, before it reads the
history, or a ``Client.pin`` caller. The consumer path never takes the lock nor reads the
transcript for them. A pin reads only its turn's records (``Store.turn_ordinals``).
"""

from __future__ import annotations

import json
import logging

from compaction_worker.conversation.meta import clear_field_if
from compaction_worker.errors import AlreadySummarized, NoSuchMessage, NotPinned, PinError, StaleFenceError
from compaction_worker.state.lock import Locks
from compaction_worker.state.refusals import Refusals
from compaction_worker.state.store import Store

log = logging.getLogger(__name__)


async def set_pinned(
    store: Store, locks: Locks, conversation_id: str, turn_seq: int, *, index: int | None, pinned: bool
) -> list[int]:
    """Pin (``pinned``) or unpin the messages of turn ``turn_seq`` (only its ``index``-th, from 0,
    when given); returns their transcript ordinals (an unpin: those it unpinned)."""
    ordinals = await _ordinals(store, conversation_id, turn_seq, index)
    async with locks.exclusive(conversation_id, store.keys(conversation_id)):
        asked = (await store.meta(conversation_id)).pins
        if asked:  # turns asked for theirs first: applied in the order asked
            await apply_asked(store, conversation_id, asked)
        changed = await _write(store, conversation_id, turn_seq, index, ordinals, pinned=pinned)
    return ordinals if pinned else changed


async def apply_asked(store: Store, conversation_id: str, asked: str) -> None:
    """Apply the pins turns asked for (the meta's ``pins``, ``asked``) and clear them; the caller holds
    the conversation's lock. A pin that cannot be applied (no such message, one a summary already
    replaced, an unpin of a message not pinned) is dropped, and recorded for the turn that asked
    (state/refusals.py: ``Client.wait_for`` reports it)."""
    refusals = Refusals(store)
    # [turn_seq, index, pin, asking turn]; entries stored before the asking turn was kept have three.
    for turn_seq, index, pinned, *by in json.loads(asked):
        try:
            ordinals = await _ordinals(store, conversation_id, turn_seq, index)
            await _write(store, conversation_id, turn_seq, index, ordinals, pinned=pinned)
        except PinError as e:
            what = "pin" if pinned else "unpin"
            log.warning("a turn's %s of turn %s was not applied: %s", what, turn_seq, e)
            if by:
                await refusals.not_applied(
                    conversation_id, by[0], f"{what} of {_named(turn_seq, index)}: {e}"
                )
        except StaleFenceError as e:  # the lock expired, and another holder changed the history
            log.warning("pins asked were not applied (%s): the next holder of the lock applies them", e)
            return
    # Only what was read: pins a turn added meanwhile stay for the next holder of the lock.
    await clear_field_if(store.redis, store.keys(conversation_id).meta, "pins", asked)


def asks_pending(asked: str, turn_seq: int) -> bool:
    """Whether pins turn ``turn_seq`` asked for wait in ``asked`` (the meta's ``pins``) to be applied."""
    return any(len(ask) > 3 and ask[3] == turn_seq for ask in json.loads(asked)) if asked else False


def _named(turn_seq: int, index: int | None) -> str:
    return f"turn {turn_seq}" if index is None else f"message {index} of turn {turn_seq}"


async def _ordinals(store: Store, conversation_id: str, turn_seq: int, index: int | None) -> list[int]:
    """The transcript ordinals of turn ``turn_seq``'s messages (its ``index``-th only, when given)."""
    ordinals = await store.turn_ordinals(conversation_id, turn_seq)
    if not ordinals:
        raise NoSuchMessage(
            f"{conversation_id} has no turn {turn_seq} with messages (its last turn is "
            f"{(await store.meta(conversation_id)).last_seq}): name a stored turn that has messages"
        )
    if index is not None:
        if not 0 <= index < len(ordinals):
            raise NoSuchMessage(
                f"turn {turn_seq} of {conversation_id} has {len(ordinals)} messages, no index {index}: "
                f"name one from 0 to {len(ordinals) - 1}, or none for all"
            )
        ordinals = [ordinals[index]]
    return ordinals


async def _write(
    store: Store, conversation_id: str, turn_seq: int, index: int | None, ordinals: list[int], *, pinned: bool
) -> list[int]:
    """Set the flag on the entries of ``ordinals``; returns those it changed. The lock is held."""
    written = await store.set_pinned(conversation_id, ordinals, pinned)
    if written.summarized:
        raise AlreadySummarized(
            f"message {', '.join(map(str, written.summarized))} of {conversation_id} (turn {turn_seq}) is "
            "already summarized: rewind the compaction that replaced it first (Client.versions lists them)"
        )
    if not pinned and not written.changed:
        raise NotPinned(
            f"{_named(turn_seq, index)} of {conversation_id} is not pinned: there is nothing to unpin "
            '(Client.messages shows what is kept; a message is pinned by "pinned": true, a turn\'s pin '
            "or Client.pin)"
        )
    return list(written.changed)
