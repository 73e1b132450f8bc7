-- Library (store.py, appends.py): pushes list items in batches, since unpack() has a C-stack limit.

-- Pushes items[first..last] (none when last < first).
local function push_slice(key, items, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end

-- Pushes every item of a list.
local function push(key, items)
  push_slice(key, items, 1, #items)
end
