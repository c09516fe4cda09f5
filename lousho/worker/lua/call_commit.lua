-- After a tool call ran: commit its result (the first writer wins), release the call's lease,
-- then try the session's lease to fold the result in (begin_step), all in one round trip.
--
-- needs: lousho.worker:begin_step
-- KEYS: 1 results, 2 call lease, 3 lease, 4 parked, 5 abort, 6 attempts, 7 head, 8 msgs
-- ARGV: 1 the call's field, 2 result JSON, 3 call lease token, then as step_begin.lua:
--       4 token, 5 ttl ms, 6 session id, 7 attempts field, 8 known writer id
-- Reply: begin_step's
redis.call('HSETNX', KEYS[1], ARGV[1], ARGV[2])
if redis.call('GET', KEYS[2]) == ARGV[3] then redis.call('DEL', KEYS[2]) end
local k = {results = KEYS[1], lease = KEYS[3], parked = KEYS[4], abort = KEYS[5], attempts = KEYS[6],
  head = KEYS[7], msgs = KEYS[8]}
return begin_step(k, ARGV[4], ARGV[5], ARGV[6], ARGV[7], ARGV[8])
