-- Hands out the next turn seq (store.py, Store.next_turn_seq).
-- KEYS: meta, seq, then the conversation's other lasting keys (their expiry moves with the
-- rest: expiry.lua). Header: {now_ms, retention_ms, at_least}. Returns one past the largest of
-- the last seq handed out, the last seq stored and `at_least` (the last one the caller published),
-- so turns published with seqs of their own are never reused.
local h = arguments()
local given = tonumber(redis.call('GET', KEYS[2]) or '0')
local stored = tonumber(redis.call('HGET', KEYS[1], 'last_seq') or '0')
local nxt = math.max(given, stored, tonumber(h.at_least or '0')) + 1
redis.call('SET', KEYS[2], string.format('%d', nxt))
local deadline = deadline_of(KEYS[1])
expire_with(KEYS[2], keep_alive(KEYS, deadline, tonumber(h.now_ms), tonumber(h.retention_ms)))
return nxt
