-- Library (gaps.py): reads a held turn's stored form: "<held_ms>:", then the turn's fingerprint
-- ("<32 hex>:"), then its original bytes. A held turn was a JSON object: its own first byte is
-- never a digit.

-- The hold time (epoch ms).
local function held_at(value)
  return tonumber(string.match(value, '^(%d+):'))
end

-- The held turn's fingerprint.
local function held_fingerprint(value)
  local fp = string.match(value, '^%d+:(%x+):')
  if fp and #fp == 32 then return fp end
  return nil
end
