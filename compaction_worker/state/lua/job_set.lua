-- KEYS: job. Header: the job's fields (see set_job).
return set_job(KEYS[1], arguments())
