-- A tool call's first round trip: read the checkpoint, the session's abort flag and epoch; then,
-- unless the call's result is committed already, take the call's lease and count this start
-- (poison detection), atomically, so no second copy starts between the look and the lease. The
-- lease's token ends in '@<epoch>': a lease an earlier incarnation of the session still holds
-- is taken over, never waited for (issue #21).
--
-- needs: read_checkpoint, lousho.worker:epoch
-- KEYS: 1 results, 2 call lease, 3 attempts, 4 abort, 5 head, 6 msgs, 7 epoch
-- ARGV: 1 the call's field ('<turn>:<call id>'), 2 token (without its epoch), 3 ttl ms,
--       4 known writer id, 5 the epoch to give a session stored without one
-- Reply: {state, aborted 0/1, {read_checkpoint reply}, epoch}; state: -1 committed already | 0
--        someone else holds the call's lease | n: this is the call's n-th start (the lease is
--        ours, its token `token@epoch`) | -2: the session has no checkpoint (no epoch)
local aborted = redis.call('EXISTS', KEYS[4])
local checkpoint = read_checkpoint(KEYS[5], KEYS[6], ARGV[4])
local epoch = session_epoch(KEYS[7], KEYS[5], ARGV[5])
if epoch == '' then return {-2, aborted, checkpoint, epoch} end
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {-1, aborted, checkpoint, epoch} end
if stale_lease(KEYS[2], epoch) then redis.call('DEL', KEYS[2]) end
if not redis.call('SET', KEYS[2], ARGV[2] .. '@' .. epoch, 'NX', 'PX', ARGV[3]) then
  return {0, aborted, checkpoint, epoch}
end
return {redis.call('HINCRBY', KEYS[3], 'call:' .. ARGV[1], 1), aborted, checkpoint, epoch}
