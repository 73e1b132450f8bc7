"""One conversation's core: its keys, its meta (the job's fields among them), the pure decision about a
turn (``decide``), the one write that carries it out (``Appends.apply``, lua/turn.lua), its status."""
