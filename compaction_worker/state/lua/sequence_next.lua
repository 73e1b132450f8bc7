-- Hands out the next turn seq (sequence.py, TurnSequence.next).
-- KEYS: seq, meta. Header: {retention_ms}. Returns one past the larger of the last seq handed
-- out and the last seq stored, so turns published with seqs of their own are never reused.
local h = arguments()
local given = tonumber(redis.call('GET', KEYS[1]) or '0')
local stored = tonumber(redis.call('HGET', KEYS[2], 'last_seq') or '0')
local nxt = math.max(given, stored) + 1
if tonumber(h.retention_ms) > 0 then
  redis.call('SET', KEYS[1], string.format('%d', nxt), 'PX', h.retention_ms)
else
  redis.call('SET', KEYS[1], string.format('%d', nxt))
end
return nxt
