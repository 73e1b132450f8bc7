-- Library (scripts.py), first in every script: the call's header (ARGV[1], JSON) with the
-- lists of strings that follow it set as its fields, by the names and lengths that the
-- header's `lists` gives. Payloads travel as they are, without a second JSON encoding.
local function arguments()
  local h = cjson.decode(ARGV[1])
  local at = 2
  for _, list in ipairs(h.lists or {}) do
    local name, n = list[1], list[2]
    local items = {}
    for i = 1, n do items[i] = ARGV[at + i - 1] end
    h[name] = items
    at = at + n
  end
  return h
end
