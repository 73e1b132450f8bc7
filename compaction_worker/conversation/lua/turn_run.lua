-- The per-turn script (conversation/apply.py): the turns of one call, in order (ARGV[1] of them, each its
-- argument count then its arguments: turn.lua), consecutive turns of one conversation, each
-- decided as turn.lua says on the meta the one before it leaves. A single turn is a run of one.
-- It stops after the first turn that is not appended (nothing written for it but its hold) and
-- after a turn whose next seq is held behind a gap (the caller applies that one first).
-- Reply: each turn's reply line, in order, up to the one it stopped at, one text, a line each;
-- after a stale turn, {that text, the stored meta hash}.
-- The turns' writes are made once, after the last (turn.lua, flush).
local lines, at = {}, 2
for i = 1, tonumber(ARGV[1]) do
  if i > 1 then at = at + 1 + tonumber(ARGV[at]) end
  local line, more = turn(at)
  lines[i] = line
  if not more then break end
end
flush()
local reply = table.concat(lines, '\n')
if w.stale then return {reply, w.stale} end
return reply
