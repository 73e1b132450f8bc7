-- Archives artifacts not archived yet (archive.py, Archive.add): a repeat keeps its first sighting.
-- KEYS: artifacts, meta. Lists: items, values (one of each per artifact). The hash takes the
-- conversation's deadline (expiry.lua).
local h = arguments()
for i = 1, #h.items do redis.call('HSETNX', KEYS[1], h.items[i], h['values'][i]) end
expire_with(KEYS[1], deadline_of(KEYS[2]))
return #h.items
