-- Records what the worker refused of a turn (refusals.py): sets one field of the conversation's
-- `refused` hash, or with `append` adds a line to what the field holds, and gives the hash the
-- conversation's deadline, or the retention from now when it has none yet (a first turn refused:
-- the conversation's first append gives it the shared one, expiry.lua).
-- KEYS: meta, refused. Header: {field, value, append ('1' or '0'), now_ms, retention_ms}.
local h = arguments()
local value = h.value
if h.append == '1' then
  local held = redis.call('HGET', KEYS[2], h.field)
  if held then value = held .. '\n' .. value end
end
redis.call('HSET', KEYS[2], h.field, value)
local deadline = deadline_of(KEYS[1])
local retention = tonumber(h.retention_ms)
if deadline == 0 and retention > 0 then deadline = tonumber(h.now_ms) + retention end
expire_with(KEYS[2], deadline)
return 1
