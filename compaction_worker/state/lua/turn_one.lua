-- The per-turn script (appends.py): one turn, its arguments from ARGV[1] (turn.lua names them).
return turn(0, false)
