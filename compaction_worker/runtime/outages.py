"""Which failures are outages: the infrastructure is away, not the event at fault.

An outage brings its turn back until the infrastructure returns, without limit; any other
failure is a bug or a poison turn, retried a bounded number of times (settings.retry.turns)
and then dead-lettered, so that one turn cannot stall its partition (runtime/turns.py).
"""

from __future__ import annotations

from aiokafka.errors import KafkaError
from redis import exceptions as redis_errors

from compaction_worker.errors import ConcurrentUpdateError

OUTAGES: tuple[type[BaseException], ...] = (
    redis_errors.ConnectionError,
    redis_errors.TimeoutError,
    redis_errors.BusyLoadingError,
    # A Redis Cluster in failover: slots unserved or moving, a primary down.
    redis_errors.ClusterError,
    redis_errors.RedisClusterException,
    redis_errors.TryAgainError,
    OSError,
    KafkaError,
    ConcurrentUpdateError,
)
"""Errors that mean "the infrastructure is away or busy", not "this event is bad"."""


def is_outage(error: BaseException) -> bool:
    """Whether a failure is an outage (retried without limit) rather than the turn's own."""
    return isinstance(error, OUTAGES)
