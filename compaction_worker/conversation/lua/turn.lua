-- Library (conversation/apply.py): decides and stores one turn; turn_run.lua calls it for each turn of a call
-- (one, or several consecutive turns of one conversation: a single turn is a run of one).
-- KEYS: meta, transcript, entries, pending, fingerprints, then the conversation's other keys
--   that live as long as it does (chunks, compactions, fence, artifacts, outbox, seq, proposal):
--   their expiry moves with the rest (expiry.lua).
-- A turn's arguments follow their count, ARGV[at], by position from ARGV[at + 1] (it runs for
--   every turn: a JSON header to decode was a fifth of its time):
--   seq, next (seq + 1), rev (the meta revision the caller computed its fields from; -1: none;
--   it must still be the stored one: every writer of the meta bumps it),
--   now_ms, retention_ms, fingerprint, first ('1': the conversation's first
--   append), then a count and that many meta field/value texts (what the append changes, the
--   job it records among them: decide.py decides it), then the message count n and
--   n transcript records (the history's verbatim tail is read from them: store.py), then the
--   turn's held form if the caller expects a gap.
-- Replies, by what the stored sequence says of the turn:
--   {'duplicate', last_seq, job_pending, next_held} / {'conflicting_duplicate', last_seq, fingerprint}
--   {'held', last_seq} / {'conflicting_held', last_seq, fingerprint} / {'need_held', last_seq}
--   {'stale', last_seq, meta hash}: the caller's revision is not the stored one; nothing written
--   {'appended', seq, rev, next_held}
-- An append's writes to the conversation's lists and hashes are gathered in `w` (writes())
-- and made once per call by flush(): a run's turns cost one RPUSH of the transcript and one HSET per
-- hash, not one each, and each turn after the first is decided on the meta the one before it
-- leaves, kept in `w`, not read again. A script is atomic: nobody sees the state between.
-- A lone turn's records are pushed straight from ARGV, no table built: a stored
-- turn at agent pace is a call of its own, and every redis.call and table is a part of its cost
-- (docs/performance.md, "Redis at agent pace").
-- The meta's `held` field is '1' while turns may be held behind a gap: every writer of a held
-- turn sets it with the turn, and an append that finds none held (the gap filled, or its turns
-- dead-lettered by a sweep) removes it. Without it the pending hash is empty and not read, so
-- a plain append makes four Redis calls: HMGET, RPUSH, HSET x2.
-- Every turn is stored or held with its fingerprint: a redelivery with another is a conflict. A
-- turn held behind a gap arrived first: a different turn with its seq is refused.
-- A call's gathered writes: the positions of the turns appended (`spans`), the meta once
-- appended (`state`, as turn() reads it: rev, last_seq, deadline, held; nil until a turn is
-- appended), whether the call found no turn held (`emptied`), the deadline it moved the
-- conversation's to (`renewed`), and the one in force before (`before`; 0: none yet).
local function writes()
  return {spans = {}}
end

-- Pushes ARGV[from..to] onto a list, in batches (unpack has a C-stack limit).
local function push_args(key, from, to)
  while from <= to do
    local last = math.min(from + 499, to)
    redis.call('RPUSH', key, unpack(ARGV, from, last))
    from = last + 1
  end
end

-- The keys an append writes, by their index in KEYS: meta, transcript, fingerprints. The
-- entries list is not one: the messages appended since a compaction are the transcript's.
local WRITTEN = {true, true, false, false, true}

-- Makes a call's gathered writes: the transcript, the meta, the fingerprints, then the deadlines
-- (after the keys exist: an expiry on a missing key is lost). A field a later turn of a run
-- writes again is written twice in one HSET: the later value is the one kept.
local function flush(w)
  if not w.state then return end
  local meta, transcript, fingerprints = KEYS[1], KEYS[2], KEYS[5]
  local fields = {'rev', string.format('%d', w.state[1])}
  local fps = {}
  if #w.spans == 1 then
    local s = w.spans[1]
    push_args(transcript, s.records, s.records + s.n - 1)
  else
    local records = {}
    for _, s in ipairs(w.spans) do
      for i = s.records, s.records + s.n - 1 do records[#records + 1] = ARGV[i] end
    end
    push(transcript, records)
  end
  for _, s in ipairs(w.spans) do
    for i = s.fields, s.fields + s.fields_n - 1 do fields[#fields + 1] = ARGV[i] end
    fps[#fps + 1] = ARGV[s.seq]
    fps[#fps + 1] = ARGV[s.fingerprint]
  end
  if w.renewed then
    fields[#fields + 1] = 'expires_at'
    fields[#fields + 1] = string.format('%d', w.renewed)
  end
  redis.call('HSET', meta, unpack(fields))
  if w.emptied then redis.call('HDEL', meta, 'held') end
  redis.call('HSET', fingerprints, unpack(fps))
  if w.first then
    for _, key in ipairs({meta, transcript, fingerprints}) do expire_with(key, w.first) end
  end
  if w.renewed then expire_moved(KEYS, WRITTEN, w.before, w.renewed) end
end

local function turn(at, w)
  local meta, pending, fingerprints = KEYS[1], KEYS[4], KEYS[5]
  local seq_text, fingerprint = ARGV[at + 1], ARGV[at + 6]
  local fields_at, fields_n = at + 9, tonumber(ARGV[at + 8])
  local n = tonumber(ARGV[fields_at + fields_n])
  local records_at = fields_at + fields_n + 1
  local held_form = nil
  if records_at + n <= at + tonumber(ARGV[at]) then held_form = ARGV[records_at + n] end
  local state = w.state or redis.call('HMGET', meta, 'rev', 'last_seq', 'expires_at', 'held')
  local rev, last, deadline = tonumber(state[1] or '0'), tonumber(state[2] or '0'), tonumber(state[3] or '0')
  local holds = state[4]
  local seq = tonumber(seq_text)
  if seq <= last then
    local stored = redis.call('HGET', fingerprints, seq_text)
    if stored and stored ~= fingerprint then
      return {'conflicting_duplicate', last, stored}
    end
    local following = 0
    if holds then following = redis.call('HEXISTS', pending, string.format('%d', last + 1)) end
    return {'duplicate', last, redis.call('HEXISTS', meta, 'job_id'), following}
  end
  if seq > last + 1 then
    local held = holds and redis.call('HGET', pending, seq_text)
    if held then
      local held_fp = held_fingerprint(held)
      if held_fp ~= fingerprint then return {'conflicting_held', last, held_fp} end
      return {'held', last}
    end
    if not held_form then return {'need_held', last} end
    redis.call('HSET', pending, seq_text, held_form)
    if not holds then redis.call('HSET', meta, 'held', '1') end
    expire_with(pending, keep_alive(KEYS, deadline, tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])))
    return {'held', last}
  end
  if tonumber(ARGV[at + 3]) ~= rev then
    return {'stale', last, redis.call('HGETALL', meta)}
  end
  local next_held = 0
  if holds then
    local waiting = redis.call('HMGET', pending, seq_text, ARGV[at + 2])
    if waiting[1] then
      local held_fp = held_fingerprint(waiting[1])
      if held_fp ~= fingerprint then return {'conflicting_held', last, held_fp} end
      redis.call('HDEL', pending, seq_text)
    end
    if waiting[2] then
      next_held = 1
    elseif redis.call('HLEN', pending) == 0 then
      holds, w.emptied = nil, true
    end
  end
  w.spans[#w.spans + 1] = {
    records = records_at, n = n, fields = fields_at, fields_n = fields_n, seq = at + 1, fingerprint = at + 6,
  }
  rev = rev + 1
  if ARGV[at + 7] == '1' then w.first = deadline end
  local kept = renewed(deadline, tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5]))
  if kept ~= deadline then
    if not w.renewed then w.before = deadline end
    w.renewed, deadline = kept, kept
  end
  w.state = {rev, seq, deadline, holds}
  return {'appended', seq, rev, next_held}
end
