"""The runtime: the worker process, the per-turn path, compaction runs and their wiring."""
