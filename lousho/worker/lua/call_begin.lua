-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A tool call's first round trip: read the checkpoint, the session's abort flag and epoch; then,
-- unless the call's result is committed already, take the call's lease and count this start
-- (poison detection), atomically, so no second copy starts between the look and the lease. The
-- lease's token ends in '@<epoch>': a lease an earlier incarnation of the session still holds
-- is taken over, never waited for (issue #21).
--
-- A start after an earlier one that never ended is counted against the call only if that run died
-- alone: every run is listed in the fleet's `running` index (score: its last beat); if another
-- session's run on the same host went quiet at the same moment, they died together (a deploy, a
-- node lost), and this start goes to `shared:<field>` instead of `call:<field>` (issue #21). A run
-- leaves the index as its result is committed (call_commit.lua, commit_fold.lua) or its task ends;
-- the entries of runs that died stay a while, for the others that died with them to find.
--
-- needs: read_checkpoint, lousho.worker:epoch
-- KEYS: 1 results, 2 call lease, 3 attempts, 4 abort, 5 head, 6 msgs, 7 epoch, 8 running (zset)
-- ARGV: 1 the call's field ('<turn>:<call id>'), 2 token (without its epoch), 3 ttl ms,
--       4 known writer id, 5 this run's entry in the running index ('<host>|<pid>|<session>|<field>'),
--       6 expiring ('1' when the store gives sessions a TTL: the attempts hash follows the head's)
-- Reply: {state, aborted 0/1, {read_checkpoint reply}, epoch, shared}; state: -1 committed already
--        | 0 someone else holds the call's lease | n: this is the call's n-th start counted against
--        it (the lease is ours, its token `token@epoch`); shared: its starts that died with others
local results, call_lease, attempts, abort, head, msgs, epoch_key, running =
  KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6], KEYS[7], KEYS[8]
local field, token, ttl_ms, writer, entry, expiring = ARGV[1], ARGV[2], tonumber(ARGV[3]), ARGV[4], ARGV[5], ARGV[6]
local aborted = redis.call('EXISTS', abort)
local checkpoint = read_checkpoint(head, msgs, writer)
local epoch = session_epoch(epoch_key)
-- A late copy of a call of a session that is gone (deleted) writes nothing: no lease, no count, no
-- entry would outlive the session's `delete()` (issue #16).
if checkpoint[1] == 'none' then return {0, aborted, checkpoint, epoch, 0} end
if redis.call('HEXISTS', results, field) == 1 then return {-1, aborted, checkpoint, epoch, 0} end
-- The lease is tried first; only a held one is read, to take over an earlier incarnation's (issue #30).
local function take_call_lease()
  return redis.call('SET', call_lease, token .. '@' .. epoch, 'NX', 'PX', ttl_ms)
end
if not take_call_lease() then
  if not stale_lease(call_lease, epoch) then return {0, aborted, checkpoint, epoch, 0} end
  redis.call('DEL', call_lease)
  take_call_lease()
end

local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', running, '-inf', now - 900000) -- runs quiet for 15 min are long gone
local counted = 'call:' .. field
local started = redis.call('HINCRBY', attempts, counted, 1)
local previous = redis.call('HGET', attempts, 'by:' .. field)
local last = previous and redis.call('ZSCORE', running, previous)
-- No earlier run named (a first start): no start of it was shared either (issue #30: not read then).
local shared = previous and tonumber(redis.call('HGET', attempts, 'shared:' .. field) or '0') or 0
if started > 1 and last then
  local host, session = string.match(previous, '^([^|]*)|[^|]*|([^|]*)|')
  last = tonumber(last)
  local near = redis.call('ZRANGEBYSCORE', running, last - ttl_ms / 2, last + ttl_ms / 2, 'WITHSCORES')
  for i = 1, #near, 2 do
    local other_host, other_session = string.match(near[i], '^([^|]*)|[^|]*|([^|]*)|')
    if other_host == host and other_session ~= session and tonumber(near[i + 1]) < now - ttl_ms then
      started = redis.call('HINCRBY', attempts, counted, -1)
      shared = redis.call('HINCRBY', attempts, 'shared:' .. field, 1)
      break
    end
  end
end
redis.call('HSET', attempts, 'by:' .. field, entry)
if expiring == '1' then -- expires with the session (issue #16); no head has a TTL otherwise (issue #30)
  local session_ttl = redis.call('PTTL', head)
  if session_ttl > 0 then redis.call('PEXPIRE', attempts, session_ttl) end
end
redis.call('ZADD', running, now, entry)
return {started, aborted, checkpoint, epoch, shared}
