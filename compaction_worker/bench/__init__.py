"""Every benchmark. ``bench``: the worker's throughput and costs beside its broker's and Redis's bare
speed. ``quality``: what compactions keep (``fidelity``, ``standing``, ``small_windows``; offline).

``command`` runs it; ``runner`` names the scenarios; ``throughput`` (worker processes, the bare
loops in ``bare``, head-of-line) and ``costs`` make the rows, ``redis_cost`` the Redis rows from
the server's own counters (``meter``); ``load`` the input and the counting of stored turns;
``environment`` the broker, Redis, fake LLM and processes (this checkout's or another's);
``report`` the table. ``trajectories`` loads published agent runs (``small_windows`` replays them).
"""
