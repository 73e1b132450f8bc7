-- Library (conversation/apply.py): decides and stores one turn; turn_run.lua calls it for each turn of a call
-- (one, or several consecutive turns of one conversation: a single turn is a run of one).
-- KEYS: meta, transcript, entries, pending, fingerprints. The conversation's other keys that live
--   as long as it does (chunks, compactions, fence, artifacts, outbox, seq, proposal) move their
--   expiry with these (expiry.lua), seldom: they are named from the meta's key (lasting_keys), not
--   passed (each key passed is a string Redis makes for every call: ~1,000 instructions of a lone
--   turn's ~110,000, measured with callgrind).
-- A turn's arguments follow their count, ARGV[at], by position from ARGV[at + 1] (it runs for
--   every turn: a JSON header to decode was a fifth of its time):
--   seq, next_rev (rev + 1: the revision an append leaves, stored as sent), rev (the meta
--   revision the caller computed its fields from; -1: none; it must still be the stored one:
--   every writer of the meta bumps it),
--   now_ms, retention_ms, fingerprint, first ('1': the conversation's first
--   append), then a count and that many meta field/value texts (what the append changes, the
--   job it records among them: decide.py decides it), then the message count n and
--   n transcript records (the history's verbatim tail is read from them: store.py), then the
--   turn's held form if the caller expects a gap.
-- A turn's reply is a line of text, words separated by a space, by what the stored sequence says
--   of the turn (a text, not a table: a table reply costs Redis a 16 KB reply block a call):
--   'duplicate last_seq job_pending next_held' / 'conflicting_duplicate last_seq fingerprint'
--   'held last_seq' / 'conflicting_held last_seq fingerprint' / 'need_held last_seq'
--   'stale last_seq': the caller's revision is not the stored one; nothing written (the stored
--   meta hash goes with the call's reply: turn_run.lua)
--   'appended seq rev next_held' (rev as next_rev's text); job_pending and next_held are 0 or 1.
-- An append's writes to the conversation's lists and hashes are gathered in `w`
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
-- A call's state, one table (every table, closure and number parsed is a part of a lone turn's
-- cost, a closure's upvalues included): its array part holds, three slots per turn appended, each
-- one's argument positions (`at`, its records', their count); `appended` counts those turns. Once
-- a turn is appended, the meta as it leaves it (`rev`, as text: the caller sends the revision an
-- append leaves; `last`, `deadline`, `holds`), kept here, not read again. Set only by rarer
-- calls, nil until then (the table is made with the fields a lone append sets: one allocation):
-- `emptied`, the call found no turn held; `renewed`, the deadline it moved the conversation's to;
-- `before`, the one in force before (0: none yet); `first`, the deadline at the conversation's
-- first append; `stale`, the stored meta hash, when a turn was stale.
local w = {false, false, false, appended = 0, rev = false, last = 0, deadline = 0, holds = false}

-- Every key of the conversation that lives as long as it does, meta first: KEYS, then the others,
-- named as conversation/keys.py names them (its key, the meta's with its last part replaced by the
-- key's name; LASTING, the names, comes from keys.py with the script: conversation/apply.py).
local function lasting_keys()
  local keys, base = {KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]}, string.sub(KEYS[1], 1, -5)
  for name in string.gmatch(LASTING, '%S+') do keys[#keys + 1] = base .. name end
  return keys
end

-- Makes the call's gathered writes: the transcript, the meta, the fingerprints, then the deadlines
-- (after the keys exist: an expiry on a missing key is lost). A lone turn's are made straight from
-- ARGV; a run's are gathered in tables first, each hash's in one HSET: a field a later turn
-- writes again is written twice in it, and the later value is the one kept. The moved deadline
-- goes before the turns' fields, which never name it.
local function flush()
  if w.appended == 0 then return end
  local meta, transcript, fingerprints = KEYS[1], KEYS[2], KEYS[5]
  local renewed_text = w.renewed and string.format('%d', w.renewed)
  if w.appended == 1 then
    local at, records, n = w[1], w[2], w[3]
    push(transcript, ARGV, records, records + n - 1)
    -- The turn's fields lie between its field count (ARGV[at + 8]) and its message count.
    if renewed_text then
      redis.call('HSET', meta, 'rev', w.rev, 'expires_at', renewed_text, unpack(ARGV, at + 9, records - 2))
    else
      redis.call('HSET', meta, 'rev', w.rev, unpack(ARGV, at + 9, records - 2))
    end
    redis.call('HSET', fingerprints, ARGV[at + 1], ARGV[at + 6])
  else
    local all, fields, fps = {}, {'rev', w.rev}, {}
    if renewed_text then fields[3], fields[4] = 'expires_at', renewed_text end
    for k = 1, 3 * w.appended, 3 do
      local at, records, n = w[k], w[k + 1], w[k + 2]
      for i = records, records + n - 1 do all[#all + 1] = ARGV[i] end
      for i = at + 9, records - 2 do fields[#fields + 1] = ARGV[i] end
      fps[#fps + 1] = ARGV[at + 1]
      fps[#fps + 1] = ARGV[at + 6]
    end
    push(transcript, all)
    redis.call('HSET', meta, unpack(fields))
    redis.call('HSET', fingerprints, unpack(fps))
  end
  if w.emptied then redis.call('HDEL', meta, 'held') end
  if w.first then
    expire_with(meta, w.first)
    expire_with(transcript, w.first)
    expire_with(fingerprints, w.first)
  end
  -- The keys an append writes, by their index in KEYS: meta, transcript, fingerprints (the
  -- entries list is not one: the messages appended since a compaction are the transcript's).
  if w.renewed then expire_moved(lasting_keys(), {true, true, false, false, true}, w.before, w.renewed) end
end

-- Decides one turn; its reply line (above), and whether the call goes on to the next turn (it
-- was appended, and its next is not held).
local function turn(at)
  local meta, pending, fingerprints = KEYS[1], KEYS[4], KEYS[5]
  local seq_text, fingerprint = ARGV[at + 1], ARGV[at + 6]
  local fields_n = tonumber(ARGV[at + 8])
  local n = tonumber(ARGV[at + 9 + fields_n])
  local records = at + 10 + fields_n
  local rev, last, deadline, holds
  if w.appended > 0 then
    rev, last, deadline, holds = w.rev, w.last, w.deadline, w.holds
  else
    local state = redis.call('HMGET', meta, 'rev', 'last_seq', 'expires_at', 'held')
    rev, last, deadline, holds = state[1] or '0', tonumber(state[2] or '0'), tonumber(state[3] or '0'), state[4]
  end
  local seq = tonumber(seq_text)
  if seq <= last then
    local stored = redis.call('HGET', fingerprints, seq_text)
    if stored and stored ~= fingerprint then
      return 'conflicting_duplicate ' .. string.format('%d', last) .. ' ' .. stored, false
    end
    local following = 0
    if holds then following = redis.call('HEXISTS', pending, string.format('%d', last + 1)) end
    local job = redis.call('HEXISTS', meta, 'job_id')
    return 'duplicate ' .. string.format('%d', last) .. ' ' .. job .. ' ' .. following, false
  end
  local now_ms, retention_ms = tonumber(ARGV[at + 4]), tonumber(ARGV[at + 5])
  if seq > last + 1 then
    local held = holds and redis.call('HGET', pending, seq_text)
    if held then
      local held_fp = held_fingerprint(held)
      if held_fp ~= fingerprint then return 'conflicting_held ' .. string.format('%d', last) .. ' ' .. held_fp, false end
      return 'held ' .. string.format('%d', last), false
    end
    -- The held form, if sent, follows the records, within the turn's ARGV[at] arguments.
    if records + n > at + tonumber(ARGV[at]) then return 'need_held ' .. string.format('%d', last), false end
    redis.call('HSET', pending, seq_text, ARGV[records + n])
    if not holds then redis.call('HSET', meta, 'held', '1') end
    expire_with(pending, keep_alive(lasting_keys(), deadline, now_ms, retention_ms))
    return 'held ' .. string.format('%d', last), false
  end
  -- Revisions are integer texts (HINCRBY's, or the caller's): equal texts, equal revisions.
  if ARGV[at + 3] ~= rev then
    w.stale = redis.call('HGETALL', meta)
    return 'stale ' .. string.format('%d', last), false
  end
  local next_held = false
  if holds then
    local waiting = redis.call('HMGET', pending, seq_text, string.format('%d', seq + 1))
    if waiting[1] then
      local held_fp = held_fingerprint(waiting[1])
      if held_fp ~= fingerprint then return 'conflicting_held ' .. string.format('%d', last) .. ' ' .. held_fp, false end
      redis.call('HDEL', pending, seq_text)
    end
    if waiting[2] then
      next_held = true
    elseif redis.call('HLEN', pending) == 0 then
      holds, w.emptied = false, true
    end
  end
  local k = 3 * w.appended
  w[k + 1], w[k + 2], w[k + 3] = at, records, n
  w.appended = w.appended + 1
  if ARGV[at + 7] == '1' then w.first = deadline end
  local kept = renewed(deadline, now_ms, retention_ms)
  if kept ~= deadline then
    if not w.renewed then w.before = deadline end
    w.renewed, deadline = kept, kept
  end
  w.rev, w.last, w.deadline, w.holds = ARGV[at + 2], seq, deadline, holds
  return 'appended ' .. seq_text .. ' ' .. ARGV[at + 2] .. (next_held and ' 1' or ' 0'), not next_held
end
