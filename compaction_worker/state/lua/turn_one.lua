-- The per-turn script (appends.py): one turn, its arguments from ARGV[1] (turn.lua names them).
local w = writes()
local reply = turn(0, false, w)
flush(w)
return reply
