-- KEYS: index. Header: {member, lease_ms}. Removes the member only if our lease still stands.
local h = arguments()
local score = redis.call('ZSCORE', KEYS[1], h.member)
if score and tonumber(score) == tonumber(h.lease_ms) then
  redis.call('ZREM', KEYS[1], h.member)
  return 1
end
return 0
