-- KEYS: job. Header: {id}. Deletes the job only if it is the one that ran.
local h = arguments()
if redis.call('HGET', KEYS[1], 'id') == h.id then
  redis.call('DEL', KEYS[1])
  return 1
end
return 0
