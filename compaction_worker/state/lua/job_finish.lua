-- KEYS: job, lock. Header: {id, token}. Deletes the job only if it is the one that ran and no
-- other run holds the lock (one that took the lock over runs this job and finishes it).
local h = arguments()
local holder = redis.call('GET', KEYS[2])
if (not holder or holder == h.token) and redis.call('HGET', KEYS[1], 'id') == h.id then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
