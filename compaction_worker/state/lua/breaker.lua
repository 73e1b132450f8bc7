-- KEYS: a model's breaker (hash: failures, open_until, probing). Header: {op, now_ms,
-- threshold, cooldown_ms, ttl_ms}; times travel as strings (scripts.py). Returns
-- {failures, open, opened}: the failed runs in a row on the model, whether runs skip it now,
-- whether this call opened it (counted once per opening).
--   check:  may this run ask the model? Open until the cooldown ends; then the first run to
--           ask is let through (a probe) and the cooldown starts again for every other run.
--   failed: one more failed run; at the threshold the breaker opens (again) for a cooldown.
--   worked: a run's summary worked: the count starts over and the breaker closes.
local h = arguments()
local key = KEYS[1]
local now = tonumber(h.now_ms)
local threshold = tonumber(h.threshold)
if h.op == 'worked' then
  redis.call('DEL', key)
  return {0, 0, 0}
end
local failures = tonumber(redis.call('HGET', key, 'failures') or '0')
local open_until = tonumber(redis.call('HGET', key, 'open_until') or '0')
local tripped = threshold > 0 and failures >= threshold
if h.op == 'check' then
  if not tripped then return {failures, 0, 0} end
  if now < open_until then return {failures, 1, 0} end
  redis.call('HSET', key, 'open_until', tostring(now + tonumber(h.cooldown_ms)), 'probing', '1')
  redis.call('PEXPIRE', key, h.ttl_ms)
  return {failures, 0, 0}
end
-- failed
failures = redis.call('HINCRBY', key, 'failures', 1)
redis.call('PEXPIRE', key, h.ttl_ms)
if threshold == 0 or failures < threshold then return {failures, 0, 0} end
-- Closed until now, or a probe that failed: this failure (re)opens it.
local opened = 0
if now >= open_until or redis.call('HGET', key, 'probing') == '1' then opened = 1 end
redis.call('HSET', key, 'open_until', tostring(now + tonumber(h.cooldown_ms)), 'probing', '0')
return {failures, 1, opened}
