-- KEYS: meta, lock. Header: {id, token, fields: the job's meta fields}. Deletes the job only if
-- it is the one that ran and no other run holds the lock (one that took the lock over runs this
-- job and finishes it), bumping the meta's revision. A meta left with its revision alone held
-- nothing but the job (a request for a conversation that had expired): it goes too.
local h = arguments()
local holder = redis.call('GET', KEYS[2])
if (not holder or holder == h.token) and redis.call('HGET', KEYS[1], 'job_id') == h.id then
  redis.call('HDEL', KEYS[1], unpack(h.fields))
  redis.call('HINCRBY', KEYS[1], 'rev', 1)
  if redis.call('HLEN', KEYS[1]) == 1 then redis.call('DEL', KEYS[1]) end
  return 1
end
return 0
