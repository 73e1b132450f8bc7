"""The ``compaction-worker`` command: the group and the worker in ``app``; the ``conversation`` group
(``conversation``) of commands that read one (``read``) or change it (``steer``), their text form in
``render``; tools (schemas, docs, bench, quality, replay) in ``tools``; the docs' view of it all in
``reference``."""

from compaction_worker.cli.app import main
from compaction_worker.cli.common import SCHEMAS_DIR

__all__ = ["SCHEMAS_DIR", "main"]
