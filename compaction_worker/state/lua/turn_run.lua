-- The run script (appends.py): consecutive turns of one conversation, appended in order in one call.
-- ARGV: the number of turns, then for each its argument count and its arguments (turn.lua).
-- Each turn is appended only if it is the next one and its stamp is the stored meta's (the
-- turn before it, appended by this call, gives the revision the caller computed it from).
-- It stops at the first turn that is not a plain append (nothing written for it) and after a
-- turn whose next seq is held behind a gap (the caller applies that one first).
-- Reply: the 'appended' replies of the turns appended, in order (none: the caller sends the first alone).
-- The turns' writes are made once, after the last (turn.lua, flush).
local replies, at, w = {}, 1, writes()
for _ = 1, tonumber(ARGV[1]) do
  local reply = turn(at + 1, true, w)
  if not reply then break end
  replies[#replies + 1] = reply
  if reply[4] == 1 then break end
  at = at + 1 + tonumber(ARGV[at + 1])
end
flush(w)
return replies
