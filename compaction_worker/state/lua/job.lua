-- Library (jobs.py): sets a conversation's job hash unless a request of equal or higher
-- priority is pending. The error, the estimate and the instructions are written together, so a
-- job never pairs one request's error with another's estimate. Returns 1 if it was set.
local function set_job(key, job)
  local current = redis.call('HGET', key, 'priority')
  if current and tonumber(current) >= tonumber(job.priority) then return 0 end
  redis.call('HSET', key, 'id', job.id, 'priority', job.priority, 'trigger', job.trigger,
    'requested_at', job.requested_at, 'error', job.error, 'estimate', job.estimate,
    'traceparent', job.traceparent or '', 'instructions', job.instructions or '')
  return 1
end
