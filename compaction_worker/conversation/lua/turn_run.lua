-- The per-turn script (conversation/apply.py): the turns of one call, in order (ARGV[1] of them, each its
-- argument count then its arguments: turn.lua), consecutive turns of one conversation, each
-- decided as turn.lua says on the meta the one before it leaves. A single turn is a run of one.
-- It stops after the first turn that is not appended (nothing written for it but its hold) and
-- after a turn whose next seq is held behind a gap (the caller applies that one first).
-- Reply: each turn's reply, in order, up to the one it stopped at.
-- The turns' writes are made once, after the last (turn.lua, flush).
local replies, at = {}, 2
for _ = 1, tonumber(ARGV[1]) do
  local reply = turn(at)
  replies[#replies + 1] = reply
  if reply[1] ~= 'appended' or reply[4] == 1 then break end
  at = at + 1 + tonumber(ARGV[at])
end
flush()
return replies
