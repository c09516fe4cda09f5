-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- save_checkpoint(): save one checkpoint of one session, all or nothing (RedisStore). A library:
-- save.lua calls it, and so does the worker's save_end.lua, which passes more KEYS and ARGV after
-- these (its own part runs only when the save did).
--
-- needs: segments, session_ttl, typed_call
--
-- KEYS: 1 head, 2 messages list, 3 history ring, 4 in-flight index, [5 the session's lease when fenced]
-- ARGV: 1 new version, 2 writer id of the head the writer built on ('' = unknown: full write),
--       3 keep: messages of that head's transcript the new one starts with (ignored on a full write),
--       4 this save's writer id, 5 the checkpoint's JSON without its messages,
--       6 history limit, 7 ttl ms (0 = none), 8 in-flight deadline ms (>0 add, 0 remove, -1 leave),
--       9 session id (the in-flight member), 10 the lease token the writer holds ('' = not fenced),
--       11 how many messages follow, 12 the history entry's JSON without its messages ('' = ARGV 5: they
--       differ when the codec binds each sealed part to its place, issue #31), 13.. the messages to append
-- The head it writes: {"$store":{"f":1,"v":version,"w":writer id,"t":ms,"s":segments,"h":digest},...},
-- `h` the chained digest of the transcript's messages as sent (segments.lua: chain_digest).
--
-- lease_taken: true when the calling script took the session's lease with this save's token itself,
-- a moment before (commit_fold.lua): the fence is not read again (issue #30).
--
-- Redis never rolls a script back: every check runs before the first write, so a
-- script that refuses (stale version, damaged head, a key of the wrong type) has
-- changed nothing.
--
-- Replies: {'ok', ms} | {'done'} (this very save was applied before: a client retry)
--          | {'conflict', stored version or -1} | {'fenced'} (the lease is not the writer's)
--          | {'resync'} (send the whole transcript: the stored head is not the writer's, or the
--            new transcript drops some of it, or it has no digest) | {'corrupt', problem}
local function save_checkpoint(lease_taken)
  if redis.replicate_commands then redis.replicate_commands() end
  local cp, msgs, hist, inflight = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
  local new_version = tonumber(ARGV[1])
  local expected_wid = ARGV[2]
  local keep = tonumber(ARGV[3])
  local wid = ARGV[4]
  local body = ARGV[5]
  local history_limit = tonumber(ARGV[6])
  local ttl_ms = tonumber(ARGV[7])
  local deadline_ms = tonumber(ARGV[8])
  local session = ARGV[9]
  local fence_token = ARGV[10]
  local entry_body = ARGV[12]
  if entry_body == '' then entry_body = body end
  local FIRST = 13
  local LAST = 12 + tonumber(ARGV[11])

  -- The head's store header, or a plain checkpoint JSON (messages inline) read as version + no segments.
  local function stored_meta(head)
    local header = string.match(head, '^{"%$store":(%b{})')
    if header then
      local ok, meta = pcall(cjson.decode, header)
      if ok and type(meta) == 'table' and type(meta.v) == 'number' and type(meta.s) == 'table' then return meta end
      return nil, 'its store header is damaged'
    end
    if not string.match(head, '^%s*{') then return nil, 'it is not a JSON object' end
    local ok, plain = pcall(cjson.decode, head)
    if not ok or type(plain) ~= 'table' then return nil, 'it is not JSON' end
    local version = plain.version
    if version == nil then version = 0 end
    if type(version) ~= 'number' then return nil, 'its version is not a number' end
    return {f = 1, v = version, s = {}}
  end

  -- The first `count` messages of a transcript given as segments {start, count} of the list.
  local function kept_segments(segs, count)
    local out, left = {}, count
    for _, seg in ipairs(segs) do
      if left <= 0 then break end
      local n = math.min(seg[2], left)
      out[#out + 1] = {seg[1], n}
      left = left - n
    end
    if left > 0 then return nil end
    return out
  end

  -- How many of the sent messages equal the stored transcript's first ones (a full write appends only the rest).
  local function common_prefix(segs)
    local matched = 0
    for _, seg in ipairs(segs) do
      local stored = redis.call('LRANGE', msgs, seg[1], seg[1] + seg[2] - 1)
      for _, message in ipairs(stored) do
        if FIRST + matched > LAST or ARGV[FIRST + matched] ~= message then return matched end
        matched = matched + 1
      end
    end
    return matched
  end

  local function transcript_length(segs)
    local count = 0
    for _, seg in ipairs(segs) do count = count + seg[2] end
    return count
  end

  local function encode_segments(segs)
    local parts = {}
    for i, seg in ipairs(segs) do parts[i] = string.format('[%d,%d]', seg[1], seg[2]) end
    return '[' .. table.concat(parts, ',') .. ']'
  end

  -- Checks: nothing is written above this line.
  if fence_token ~= '' and not lease_taken and redis.call('GET', KEYS[5]) ~= fence_token then return {'fenced'} end
  -- The head and the list are type-checked by their reads, the history ring and the in-flight index by
  -- their writes, made first (below): no TYPE is asked of a key of the right type (typed_call.lua, issue #30).
  local head, bad = typed_read('GET', cp, 'string')
  local list_length
  if not bad then list_length, bad = typed_read('LLEN', msgs, 'list') end
  if bad then return {'corrupt', bad} end
  local stored = {f = 1, v = 0, s = {}}
  if head then
    local meta, problem = stored_meta(head)
    if not meta then return {'corrupt', problem} end
    if (tonumber(meta.f) or 1) > 1 then
      return {'corrupt', 'it was written by a newer lousho (store format ' .. tostring(meta.f) .. '); upgrade lousho'}
    end
    stored = meta
  end
  if stored.v == new_version and stored.w == wid then return {'done'} end
  local problem = segments_problem(stored.s, list_length)
  if problem then return {'corrupt', problem} end
  if stored.v ~= new_version - 1 then
    if head then return {'conflict', stored.v} end
    return {'conflict', -1}
  end
  -- Incremental: ARGV holds only the new messages. Full: ARGV holds the whole transcript, and the
  -- stored one must still hash to its head's digest (issue #31: no save lands on a message changed
  -- since it was saved; the writer's cache was dropped when its read saw it, so it sends it all).
  local first_new = FIRST
  if expected_wid == '' and type(stored.h) == 'string' then
    local digest = ''
    for _, seg in ipairs(stored.s) do
      local part = redis.call('LRANGE', msgs, seg[1], seg[1] + seg[2] - 1)
      digest = chain_digest(digest, part, 1, #part)
    end
    if digest ~= stored.h then
      return {'corrupt', 'its messages do not hash to the digest its head carries: one was changed, moved or '
        .. 'removed after it was saved'}
    end
  end
  if expected_wid == '' then
    keep = common_prefix(stored.s)
    first_new = FIRST + keep
  elseif stored.w ~= expected_wid then
    return {'resync'}
  end
  local segs = kept_segments(stored.s, keep)
  if not segs then return {'resync'} end
  -- The new head's digest `h` (read_checkpoint.lua checks the list against it): on a full write,
  -- of the sent transcript (its kept part equals the stored one byte for byte); on an incremental
  -- one, the stored `h` extended by the new messages, so only when the new transcript keeps the
  -- whole stored one and the stored head has `h`. Never hashed from the stored list: a digest of a
  -- damaged message would vouch for it (issue #21). A resync sends the whole transcript instead.
  local digest
  if expected_wid == '' then
    digest = chain_digest('', ARGV, FIRST, LAST)
  elseif type(stored.h) ~= 'string' or keep ~= transcript_length(stored.s) then
    return {'resync'}
  else
    digest = chain_digest(stored.h, ARGV, FIRST, LAST)
  end

  -- Writes. The history ring's entry and the in-flight index go first: each write is its key's type
  -- check (typed_call), and one that finds a wrong type refuses the save with nothing else written (the
  -- ring's entry, if pushed, taken back: the script is atomic, so nothing saw it).
  local count = LAST - first_new + 1
  local base = list_length
  if count > 0 then
    local last = segs[#segs]
    if last and last[1] + last[2] == base then last[2] = last[2] + count else segs[#segs + 1] = {base, count} end
  end
  local now = redis.call('TIME')
  local now_ms = tonumber(now[1]) * 1000 + math.floor(tonumber(now[2]) / 1000)
  local header = string.format('{"$store":{"f":1,"v":%d,"w":"%s","t":%d,"s":%s,"h":"%s"},', new_version, wid,
    now_ms, encode_segments(segs), digest)
  local ring_length = 0
  if history_limit > 0 then
    local pushed, wrong = typed_call('list', 'LPUSH', hist, header .. string.sub(entry_body, 2))
    if not pushed then return {'corrupt', wrong} end
    ring_length = pushed
  end
  local indexed, wrong_index = true, nil -- `indexed`: the write's reply, not needed
  if deadline_ms > 0 then
    indexed, wrong_index = typed_call('zset', 'ZADD', inflight, now_ms + deadline_ms, session)
  elseif deadline_ms == 0 then
    indexed, wrong_index = typed_call('zset', 'ZREM', inflight, session)
  end
  if wrong_index then
    if history_limit > 0 then redis.call('LPOP', hist) end
    return {'corrupt', wrong_index}
  end
  for i = first_new, LAST, 1000 do
    redis.call('RPUSH', msgs, unpack(ARGV, i, math.min(i + 999, LAST)))
  end
  redis.call('SET', cp, header .. string.sub(body, 2))
  -- The ring is trimmed only once it holds more than its limit: LPUSH said how long it is (issue #30).
  if ring_length > history_limit then redis.call('LTRIM', hist, 0, history_limit - 1) end
  if ttl_ms > 0 then
    redis.call('PEXPIRE', cp, ttl_ms)
    redis.call('PEXPIRE', msgs, ttl_ms)
    redis.call('PEXPIRE', hist, ttl_ms)
    expire_session_fleet_keys(cp, ttl_ms) -- the fleet's keys of the session live as long (issue #16)
  end
  return {'ok', now_ms}
end
