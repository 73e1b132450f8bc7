-- Library (store.py, conversation/apply.py): pushes list items in batches, since unpack() has a C-stack limit.

-- Pushes the items of a list, in order: all of them, or items[from..to] (a lone turn's records
-- straight from ARGV: conversation/lua/turn.lua).
local function push(key, items, from, to)
  local i, last = from or 1, to or #items
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end
