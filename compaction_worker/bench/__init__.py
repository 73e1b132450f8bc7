"""The ``bench`` command: the worker's throughput and costs beside its broker's and Redis's bare speed.

``command`` runs it; ``runner`` names the scenarios; ``throughput`` (worker processes, the bare
loop in ``bare``, head-of-line) and ``costs`` make the rows; ``load`` the input and the counting
of stored turns; ``environment`` the broker, Redis, fake LLM and processes; ``report`` the table.
"""
