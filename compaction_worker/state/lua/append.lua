-- Appends one turn if it is the next in sequence (store.py, Store.append_turn).
-- KEYS: meta, transcript, entries, pending, chunks, compactions, job, fence, fingerprints,
--   artifacts: every key of the conversation that has a retention TTL to refresh.
-- Header: {seq, expected_count, history_delta, now, retention_ms, meta = {field: text},
--   job = {...} (optional, see set_job), fingerprint (optional), next (optional: the next
--   seq, as text)}; lists: records (for the transcript), entries (for the effective
--   history), one of each per message.
-- Appended, it also returns whether turn `next` is held and the meta hash after the append,
-- so the caller needs no further round trip for its threshold check and its drain.
-- A turn stored before fingerprints were kept has none: a redelivery of it is accepted as
-- a duplicate, as every redelivery was then. A turn held behind a gap arrived first, so a
-- different turn with its seq is refused (it would otherwise replace it unseen).
local meta, transcript, entries, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local job, fingerprints = KEYS[7], KEYS[9]
local h = arguments()
local seq = tonumber(h.seq)
local last = tonumber(redis.call('HGET', meta, 'last_seq') or '0')
if seq <= last then
  local stored = redis.call('HGET', fingerprints, h.seq)
  if h.fingerprint and stored and stored ~= h.fingerprint then return {'conflicting_duplicate', last} end
  return {'duplicate', last}
end
if seq ~= last + 1 then return {'gap', last} end
local count = tonumber(redis.call('HGET', meta, 'msg_count') or '0')
if count ~= h.expected_count then return {'conflict', last} end
if h.fingerprint then
  local held = redis.call('HGET', pending, h.seq)
  if held then
    local held_fp = held_fingerprint(held)
    if held_fp and held_fp ~= h.fingerprint then return {'conflicting_held', last} end
  end
end
push(transcript, h.records)
push(entries, h.entries)
for k, v in pairs(h.meta) do redis.call('HSET', meta, k, v) end
redis.call('HSET', meta, 'last_seq', h.seq, 'msg_count', count + #h.records, 'updated_at', h.now)
redis.call('HSETNX', meta, 'created_at', h.now)
redis.call('HSETNX', meta, 'version', 0)
redis.call('HSETNX', meta, 'context_status', 'full')
local history = redis.call('HINCRBY', meta, 'history_tokens', h.history_delta)
redis.call('HDEL', pending, h.seq)
if h.fingerprint then redis.call('HSET', fingerprints, h.seq, h.fingerprint) end
if h.job then set_job(job, h.job) end
if h.retention_ms > 0 then
  for i = 1, #KEYS do redis.call('PEXPIRE', KEYS[i], h.retention_ms) end
end
local next_held = 0
if h.next and redis.call('HEXISTS', pending, h.next) == 1 then next_held = 1 end
return {'appended', seq, history, next_held, redis.call('HGETALL', meta)}
