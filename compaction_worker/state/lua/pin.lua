-- Flags messages of a conversation's effective history (store.py, Store.set_pinned): sets entries
-- of the list in place, and moves transcript records into it (the history's entries are the list,
-- then the transcript from the meta's `tail`), unless the history changed since the caller read
-- it: a commit or a rewind bumps `version`, a pin moves `tail` or lengthens the list. The caller
-- holds the conversation's lock; this keeps a holder whose lock expired meanwhile from writing
-- over another's commit (docs/design.md, invariant 3).
-- KEYS: meta, entries.
-- Header: {version, tail, listed (the list's length read), moved_to (the new tail)}; lists:
--   set (list index and entry JSON, in pairs), moved (the entries the moved records become).
-- Returns 1 when written, 0 when the history changed (nothing written).
local meta, entries = KEYS[1], KEYS[2]
local h = arguments()
local stored = redis.call('HMGET', meta, 'version', 'tail')
if (stored[1] or '0') ~= h.version or (stored[2] or '0') ~= h.tail
  or redis.call('LLEN', entries) ~= tonumber(h.listed) then
  return 0
end
for i = 1, #h.set, 2 do redis.call('LSET', entries, h.set[i], h.set[i + 1]) end
if #h.moved > 0 then
  push(entries, h.moved)
  redis.call('HSET', meta, 'tail', h.moved_to)
  redis.call('HINCRBY', meta, 'rev', 1)
  expire_with(entries, deadline_of(meta)) -- the list may be new: the conversation's deadline
end
return 1
