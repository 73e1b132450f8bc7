-- KEYS: pending. The oldest hold time (epoch ms), or nil when nothing is held.
local oldest = nil
for _, value in ipairs(redis.call('HVALS', KEYS[1])) do
  local held = tonumber((held_of(value)))
  if oldest == nil or held < oldest then oldest = held end
end
if oldest == nil then return false end
return oldest
