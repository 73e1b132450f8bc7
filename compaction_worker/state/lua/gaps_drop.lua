-- KEYS: pending. Header: {seq, stamp}. Deletes the held turn with this seq if it is the copy the
-- caller read: its stored form starts with `stamp` (its hold time and fingerprint).
local h = arguments()
local value = redis.call('HGET', KEYS[1], h.seq)
if not value or string.sub(value, 1, #h.stamp) ~= h.stamp then return 0 end
redis.call('HDEL', KEYS[1], h.seq)
return 1
