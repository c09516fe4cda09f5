-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- After a tool call ran: commit its result (the first writer wins), release the call's lease,
-- then try the session's lease to fold the result in (begin_step), all in one round trip. Only
-- while the session is still the incarnation the call ran for (epoch.lua): otherwise nothing.
--
-- needs: lousho.worker:begin_step
-- The run leaves the fleet's running index (call_begin.lua) in any case.
--
-- KEYS: 1 results, 2 call lease, 3 lease, 4 parked, 5 abort, 6 attempts, 7 head, 8 msgs, 9 epoch,
--       10 running
-- ARGV: 1 the call's field, 2 result JSON, 3 call lease token, 4 the call's epoch, then as
--       open_step.lua: 5 token, 6 ttl ms, 7 session id, 8 attempts field, 9 known writer id, 10 expiring;
--       then 11 the run's entry in the running index
-- Reply: {-1} when the session is another incarnation now | begin_step's
local k = {results = KEYS[1], lease = KEYS[3], parked = KEYS[4], abort = KEYS[5], attempts = KEYS[6],
  head = KEYS[7], msgs = KEYS[8], epoch = KEYS[9]}
local call_lease, running = KEYS[2], KEYS[10]
local field, result, call_token, call_epoch = ARGV[1], ARGV[2], ARGV[3], ARGV[4]
local token, ttl_ms, session, attempts_field, writer = ARGV[5], ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local expiring, entry = ARGV[10], ARGV[11]
if redis.call('GET', call_lease) == call_token then redis.call('DEL', call_lease) end
redis.call('ZREM', running, entry)
if not same_epoch(k.epoch, call_epoch) then return {-1} end
redis.call('HSETNX', k.results, field, result)
return begin_step(k, token, ttl_ms, session, attempts_field, writer, expiring)
