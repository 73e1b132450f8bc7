-- Library (gaps.py): reads a held turn's stored form, "<held_ms>:" or "<held_ms>/<lease_ms>:"
-- (while a sweep dead-letters it), then the turn's fingerprint ("<32 hex>:"),
-- then its original bytes. A held turn was a JSON object: its own first byte is never a digit.

-- The hold time (as written), the lease (0: none) and where the rest starts.
local function held_of(value)
  local held, lease, at = string.match(value, '^(%d+)/(%d+):()')
  if held then return held, tonumber(lease), at end
  held, at = string.match(value, '^(%d+):()')
  return held, 0, at
end

-- The held turn's fingerprint.
local function held_fingerprint(value)
  local fp = string.match(value, '^%d+/?%d*:(%x+):')
  if fp and #fp == 32 then return fp end
  return nil
end
