"""The ``bench`` command: the worker's throughput and costs beside its broker's and Redis's bare speed.

``command`` runs it; ``runner`` names the scenarios; ``throughput`` (worker processes, the bare
loops in ``bare``, head-of-line) and ``costs`` make the rows, ``redis_cost`` the Redis rows from
the server's own counters (``meter``); ``load`` the input and the counting of stored turns;
``environment`` the broker, Redis, fake LLM and processes (this checkout's or another's);
``report`` the table.
"""
