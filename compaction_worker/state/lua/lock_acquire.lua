-- KEYS: lock, fence. Header: {token, ttl_ms}. Returns the new fence, or nil if the lock is held.
local h = arguments()
if redis.call('SET', KEYS[1], h.token, 'NX', 'PX', h.ttl_ms) then
  return redis.call('INCR', KEYS[2])
end
return nil
