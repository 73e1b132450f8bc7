-- KEYS: meta. Header: {rev (the revision the caller decided on)}; list: fields (name and value
-- pairs). Sets the fields only if the meta's revision is still `rev` (conversation/apply.py,
-- record_request), bumping it, as every write of the meta does. Returns 1 if written.
local h = arguments()
if (redis.call('HGET', KEYS[1], 'rev') or '0') ~= h.rev then return 0 end
redis.call('HSET', KEYS[1], unpack(h.fields))
redis.call('HINCRBY', KEYS[1], 'rev', 1)
return 1
