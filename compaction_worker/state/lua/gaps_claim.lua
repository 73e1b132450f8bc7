-- KEYS: pending. Header: {cutoff_ms, now_ms, lease_ms}.
-- Leases every turn held at or before the cutoff that no live lease covers; returns a flat
-- list of (seq, held_ms, fingerprint and original bytes).
local h = arguments()
local out = {}
local fields = redis.call('HGETALL', KEYS[1])
for i = 1, #fields, 2 do
  local value = fields[i + 1]
  local held, lease, at = held_of(value)
  if tonumber(held) <= tonumber(h.cutoff_ms) and lease <= tonumber(h.now_ms) then
    local raw = string.sub(value, at)
    redis.call('HSET', KEYS[1], fields[i], held .. '/' .. h.lease_ms .. ':' .. raw)
    out[#out + 1] = fields[i]
    out[#out + 1] = held
    out[#out + 1] = raw
  end
end
return out
