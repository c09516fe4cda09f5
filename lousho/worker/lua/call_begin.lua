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
--       4 known writer id, 5 this run's entry in the running index ('<host>|<pid>|<session>|<field>')
-- Reply: {state, aborted 0/1, {read_checkpoint reply}, epoch, shared}; state: -1 committed already
--        | 0 someone else holds the call's lease | n: this is the call's n-th start counted against
--        it (the lease is ours, its token `token@epoch`); shared: its starts that died with others
local aborted = redis.call('EXISTS', KEYS[4])
local checkpoint = read_checkpoint(KEYS[5], KEYS[6], ARGV[4])
local epoch = session_epoch(KEYS[7])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {-1, aborted, checkpoint, epoch, 0} end
if stale_lease(KEYS[2], epoch) then redis.call('DEL', KEYS[2]) end
if not redis.call('SET', KEYS[2], ARGV[2] .. '@' .. epoch, 'NX', 'PX', ARGV[3]) then
  return {0, aborted, checkpoint, epoch, 0}
end

local ttl_ms = tonumber(ARGV[3])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[8], '-inf', now - 900000) -- runs quiet for 15 min are long gone
local field, counted = ARGV[1], 'call:' .. ARGV[1]
local started = redis.call('HINCRBY', KEYS[3], counted, 1)
local previous = redis.call('HGET', KEYS[3], 'by:' .. field)
local last = previous and redis.call('ZSCORE', KEYS[8], previous)
if started > 1 and last then
  local host, session = string.match(previous, '^([^|]*)|[^|]*|([^|]*)|')
  last = tonumber(last)
  local near = redis.call('ZRANGEBYSCORE', KEYS[8], last - ttl_ms / 2, last + ttl_ms / 2, 'WITHSCORES')
  for i = 1, #near, 2 do
    local other_host, other_session = string.match(near[i], '^([^|]*)|[^|]*|([^|]*)|')
    if other_host == host and other_session ~= session and tonumber(near[i + 1]) < now - ttl_ms then
      started = redis.call('HINCRBY', KEYS[3], counted, -1)
      redis.call('HINCRBY', KEYS[3], 'shared:' .. field, 1)
      break
    end
  end
end
redis.call('HSET', KEYS[3], 'by:' .. field, ARGV[5])
redis.call('ZADD', KEYS[8], now, ARGV[5])
return {started, aborted, checkpoint, epoch, tonumber(redis.call('HGET', KEYS[3], 'shared:' .. field) or '0')}
