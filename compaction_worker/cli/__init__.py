"""The ``compaction-worker`` command: the group and the worker in ``app``, operator commands in
``operate``, tools (schemas, docs, bench, quality, replay) in ``tools``."""

from compaction_worker.cli.app import main
from compaction_worker.cli.common import SCHEMAS_DIR

__all__ = ["SCHEMAS_DIR", "main"]
