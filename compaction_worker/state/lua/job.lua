-- Library (jobs.py): sets a conversation's job hash unless a request of equal or higher
-- priority is pending. The error, the estimate and the instructions are written together, so a
-- job never pairs one request's error with another's estimate. Returns 1 if it was set.
-- A request's instructions are never dropped while a job is pending: whichever request's job
-- stays, it carries the other's instructions after its own (up to 8,000 characters, twice a
-- request's limit; past it the newest request's alone).
local function merged_instructions(own, other, newest)
  if other == '' or string.find(own, other, 1, true) then return own end
  if own == '' or string.find(other, own, 1, true) then return other end
  if #own + #other + 2 > 8000 then return newest end
  return own .. '\n\n' .. other
end

local function set_job(key, job)
  local current = redis.call('HMGET', key, 'priority', 'instructions')
  local held, asked = current[2] or '', job.instructions or ''
  if current[1] and tonumber(current[1]) >= tonumber(job.priority) then
    local kept = merged_instructions(held, asked, asked)
    if kept ~= held then redis.call('HSET', key, 'instructions', kept) end
    return 0
  end
  redis.call('HSET', key, 'id', job.id, 'priority', job.priority, 'trigger', job.trigger,
    'requested_at', job.requested_at, 'error', job.error, 'estimate', job.estimate,
    'traceparent', job.traceparent or '', 'instructions', merged_instructions(asked, held, asked))
  return 1
end
