-- Library (docs/design.md, "Retention"): a conversation's keys expire together, at the one
-- deadline its meta hash keeps (`expires_at`, epoch ms). Every script that creates one of its
-- keys gives it that deadline; the per-turn script moves the deadline (and re-applies it to
-- every key) only when less than half the retention is left, not on every turn.

-- The conversation's deadline (0: none yet, or no retention).
local function deadline_of(meta)
  return tonumber(redis.call('HGET', meta, 'expires_at') or '0')
end

-- Give a key the conversation's deadline (a no-op without one).
local function expire_with(key, deadline)
  if deadline > 0 then redis.call('PEXPIREAT', key, string.format('%d', deadline)) end
end

-- The deadline in force at now_ms: moved to now + retention when less than half of it is left.
local function renewed(deadline, now_ms, retention_ms)
  if retention_ms <= 0 or deadline - now_ms >= retention_ms / 2 then return deadline end
  return now_ms + retention_ms
end

-- Give every key in `keys` (the meta hash first) a deadline.
local function expire_all(keys, deadline)
  for i = 1, #keys do redis.call('PEXPIREAT', keys[i], string.format('%d', deadline)) end
end

-- Apply a moved deadline to every key in `keys`. A conversation's first one (`before` 0) goes to
-- the keys the caller wrote (`written[i]` true) and to the others only if one of them exists: a
-- new conversation seldom has any (one EXISTS, not a PEXPIREAT each); a fence from a lock taken
-- before any turn, or a handed-out seq, still gets it.
local function expire_moved(keys, written, before, deadline)
  if before ~= 0 then
    expire_all(keys, deadline)
    return
  end
  local others = {}
  for i = 1, #keys do
    if written[i] then expire_with(keys[i], deadline) else others[#others + 1] = keys[i] end
  end
  if #others > 0 and redis.call('EXISTS', unpack(others)) > 0 then
    for _, key in ipairs(others) do expire_with(key, deadline) end
  end
end

-- Move the deadline as `renewed` says, and if it moved, store it and apply it to every key in
-- `keys` (the meta hash first); returns the deadline in force.
local function keep_alive(keys, deadline, now_ms, retention_ms)
  local kept = renewed(deadline, now_ms, retention_ms)
  if kept == deadline then return deadline end
  redis.call('HSET', keys[1], 'expires_at', string.format('%d', kept))
  expire_moved(keys, {true}, deadline, kept)
  return kept
end
