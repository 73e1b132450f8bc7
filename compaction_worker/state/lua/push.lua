-- Library (store.py, conversation/apply.py): pushes list items in batches, since unpack() has a C-stack limit.

-- Pushes every item of a list, in order.
local function push(key, items)
  local i, last = 1, #items
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end
