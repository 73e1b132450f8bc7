-- KEYS: lock, fence, meta (the fence takes the conversation's deadline: expiry.lua).
-- Header: {token, ttl_ms}. Returns {1, the new fence}, or {0, the lock's remaining ms} when
-- another holds it (the caller looks again then, not sooner).
local h = arguments()
if redis.call('SET', KEYS[1], h.token, 'NX', 'PX', h.ttl_ms) then
  local fence = redis.call('INCR', KEYS[2])
  expire_with(KEYS[2], deadline_of(KEYS[3]))
  return {1, fence}
end
return {0, redis.call('PTTL', KEYS[1])}
