-- Replaces a conversation's effective history for a fenced writer: a compaction's commit
-- (store.py) or a rewind (restore.py). Refuses a stale writer, then replaces all chunks
-- and the first `consumed` entries, keeping the entries appended since the writer's
-- snapshot (the suffix) after the new ones.
-- The history's entries are the `entries` list, then the transcript's records from the meta's
-- `tail` (a list index): an append pushes to the transcript only (store.py). The new entries
-- go to the list; a suffix still in the list stays there, and one in the transcript stays
-- there: `tail` moves past what was consumed of it.
-- KEYS: meta, chunks, entries, compactions, lock, fence, outbox, transcript. Every write bumps
--   the meta's revision (`rev`), which the per-turn script's caller computed from.
-- Header: {fence, lock_token, expected_version, consumed, tokens, recount, status, now, and a
--   commit's floor_tokens and compacted_seq (budget/threshold.py; a rewind's are 0)};
--   lists: chunks, entries, record (the log record: a JSON object), outbox (field and
--   event, or empty; the event is outbox.pack's: topic, newline, JSON).
--   Without `recount`, `tokens` is the change in history tokens (a compaction knows exactly
--   what it replaced); with it, the tokens of the new chunks and entries, and the total is
--   recomputed from them and the suffix (a rewind repairs any drift).
local meta, chunks, entries, log, lock, fence, outbox, transcript = unpack(KEYS)
local h = arguments()
if redis.call('GET', fence) ~= h.fence then return {'stale_fence'} end
if redis.call('GET', lock) ~= h.lock_token then return {'lock_lost'} end
local stored = redis.call('HMGET', meta, 'version', 'tail')
local version, tail = tonumber(stored[1] or '0'), tonumber(stored[2] or '0')
if version ~= h.expected_version then return {'stale_version', version} end
local listed = redis.call('LLEN', entries)
local len = listed + redis.call('LLEN', transcript) - tail
if len < h.consumed then return {'corrupt', len} end
local suffix = {}
if listed > h.consumed then
  suffix = redis.call('LRANGE', entries, h.consumed, -1)
else
  tail = tail + h.consumed - listed
end
redis.call('DEL', chunks, entries)
push(chunks, h.chunks)
push(entries, h.entries)
push(entries, suffix)
local history
if h.recount then
  history = tonumber(h.tokens)
  for i = 1, #suffix do history = history + tonumber(cjson.decode(suffix[i]).t) end
  for _, record in ipairs(redis.call('LRANGE', transcript, tail, -1)) do
    history = history + tonumber(cjson.decode(record).t)
  end
  redis.call('HSET', meta, 'history_tokens', history)
else
  history = redis.call('HINCRBY', meta, 'history_tokens', h.tokens)
end
redis.call('HSET', meta, 'version', version + 1, 'context_status', h.status, 'tail', tail,
  'updated_at', h.now, 'noop_tokens', 0, 'failures', 0, 'retry_after', 0,
  'floor_tokens', h.floor_tokens or 0, 'compacted_seq', h.compacted_seq or 0)
redis.call('HINCRBY', meta, 'rev', 1)
-- The log record gains what only this script knows (docs/design.md, "Commit and rewind"): the
-- last seq stored and the history's total once committed (the inspector's sawtooth drops
-- there), and a commit's completion event (its model, LLM usage, cost, duration). Spliced in
-- as text: the record is a JSON object and the event is JSON, so neither is decoded here.
local record = h.record[1]
local extra = ',"last_seq":"' .. (redis.call('HGET', meta, 'last_seq') or '0')
  .. '","history_tokens":"' .. string.format('%d', history) .. '"'
if h.outbox[1] then
  local event = h.outbox[2]
  extra = extra .. ',"completed":' .. string.sub(event, string.find(event, '\n', 1, true) + 1)
end
redis.call('RPUSH', log, string.sub(record, 1, -2) .. extra .. '}')
if h.outbox[1] then redis.call('HSET', outbox, h.outbox[1], h.outbox[2]) end
-- Written anew or perhaps for the first time: each takes the conversation's deadline.
local deadline = deadline_of(meta)
for _, key in ipairs({chunks, entries, log, outbox}) do expire_with(key, deadline) end
return {'committed', version + 1, history, len - h.consumed}
