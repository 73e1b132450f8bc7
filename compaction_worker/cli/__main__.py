"""``python -m compaction_worker.cli``: the same as the ``compaction-worker`` command."""

import sys

from compaction_worker.cli.app import main

sys.exit(main())
