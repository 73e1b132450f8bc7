-- KEYS: index. Header: {member, now_ms, lease_ms}. Moves a due member's score to the end
-- of a lease; returns the lease, or nil if the member is not due (or not there).
local h = arguments()
local score = redis.call('ZSCORE', KEYS[1], h.member)
if not score or tonumber(score) > tonumber(h.now_ms) then return nil end
redis.call('ZADD', KEYS[1], h.lease_ms, h.member)
return h.lease_ms
