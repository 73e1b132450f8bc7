-- KEYS: pending. The earliest hold time of the held turns (the index's score), nil when none is held.
local lowest = nil
for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
  local held = held_at(value)
  if lowest == nil or held < lowest then lowest = held end
end
if lowest == nil then return false end
return string.format('%d', lowest)
