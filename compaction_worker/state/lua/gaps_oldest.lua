-- KEYS: pending. Header: {timeout_ms}. The index score the held turns call for: the earliest
-- time one of them is due to be looked at, minus the timeout (the index is scored by hold
-- time). A turn a sweep leased is due when its lease runs out, not before. Nil when nothing is held.
local h = arguments()
local timeout = tonumber(h.timeout_ms)
local lowest = nil
for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
  local held, lease = held_of(value)
  local score = math.max(tonumber(held), lease - timeout)
  if lowest == nil or score < lowest then lowest = score end
end
if lowest == nil then return false end
return string.format('%d', lowest)
