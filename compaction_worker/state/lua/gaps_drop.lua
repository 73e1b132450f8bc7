-- KEYS: pending. Header: {seq, lease_ms}. Deletes the held turn only under our own lease.
local h = arguments()
local value = redis.call('HGET', KEYS[1], h.seq)
if not value then return 0 end
local _, lease = held_of(value)
if lease ~= tonumber(h.lease_ms) then return 0 end
redis.call('HDEL', KEYS[1], h.seq)
return 1
