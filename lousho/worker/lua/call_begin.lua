-- A tool call's first round trip: read the checkpoint and the session's abort flag; then, unless
-- the call's result is committed already, take the call's lease and count this start (poison
-- detection), atomically, so no second copy starts between the look and the lease.
--
-- needs: read_checkpoint
-- KEYS: 1 results, 2 call lease, 3 attempts, 4 abort, 5 head, 6 msgs
-- ARGV: 1 the call's field ('<turn>:<call id>'), 2 token, 3 ttl ms, 4 known writer id
-- Reply: {state, aborted 0/1, {read_checkpoint reply}}; state: -1 committed already | 0 someone
--        else holds the call's lease | n: this is the call's n-th start (the lease is ours)
local aborted = redis.call('EXISTS', KEYS[4])
local checkpoint = read_checkpoint(KEYS[5], KEYS[6], ARGV[4])
if redis.call('HEXISTS', KEYS[1], ARGV[1]) == 1 then return {-1, aborted, checkpoint} end
if not redis.call('SET', KEYS[2], ARGV[2], 'NX', 'PX', ARGV[3]) then return {0, aborted, checkpoint} end
return {redis.call('HINCRBY', KEYS[3], 'call:' .. ARGV[1], 1), aborted, checkpoint}
