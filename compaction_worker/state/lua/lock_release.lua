-- KEYS: lock. Header: {token}. Deletes the lock only for its holder.
local h = arguments()
if redis.call('GET', KEYS[1]) == h.token then
  return redis.call('DEL', KEYS[1])
end
return 0
