-- KEYS: meta. Header: {job: the new job's meta fields (jobs.JobRequest.fields)}.
-- Records a compaction request made outside a turn (a turn's own is planned with its append:
-- runtime/plan.py) unless a request of equal or higher priority is pending. Such a request
-- carries no instructions: a job it replaces hands its own on. The write bumps the meta's
-- revision, as every write of it does. Returns 1 if the request is the job now.
local job = arguments().job
local current = redis.call('HMGET', KEYS[1], 'job_id', 'job_priority', 'job_instructions')
if current[1] and tonumber(current[2]) >= tonumber(job.job_priority) then return 0 end
job.job_instructions = current[3] or ''
local fields = {}
for name, value in pairs(job) do
  fields[#fields + 1] = name
  fields[#fields + 1] = value
end
redis.call('HSET', KEYS[1], unpack(fields))
redis.call('HINCRBY', KEYS[1], 'rev', 1)
return 1
