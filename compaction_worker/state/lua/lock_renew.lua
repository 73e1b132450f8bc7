-- KEYS: lock. Header: {token, ttl_ms}. Extends the lock only for its holder.
local h = arguments()
if redis.call('GET', KEYS[1]) == h.token then
  return redis.call('PEXPIRE', KEYS[1], h.ttl_ms)
end
return 0
