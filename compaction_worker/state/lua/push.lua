-- Library (store.py, appends.py): pushes a list in batches, since unpack() has a C-stack limit.
local function push(key, items)
  local i, last = 1, #items
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(items, i, j))
    i = j + 1
  end
end

-- Pushes the arguments ARGV[first..last] (none when last < first), in batches.
local function push_range(key, first, last)
  local i = first
  while i <= last do
    local j = math.min(i + 499, last)
    redis.call('RPUSH', key, unpack(ARGV, i, j))
    i = j + 1
  end
end
