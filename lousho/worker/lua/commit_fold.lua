-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A tool call's result when its turn waits for nothing else: commit it, release the call's lease,
-- take the session's lease, save the checkpoint with the result recorded and end the step, in one
-- round trip (issue #9). The fold was made from the checkpoint read before the call ran: if the
-- session moved since (another result, new input), the save's version check refuses it and the
-- worker folds the usual way. So does anything else that needs a look: a lease held by someone
-- else, another result committed first, the session parked, aborted, or another incarnation now.
--
-- needs: save_checkpoint, lousho.worker:end_step
-- KEYS: save_checkpoint's 1-5 (5: the session's lease), then 6 dispatched, 7 results, 8 attempts,
--       9 the broker's queue, 10 the call's lease, 11 parked, 12 abort, 13 epoch, 14 running, then with a
--       delivery tag 15 kombu's unacked hash and 16 its index
-- ARGV: save_checkpoint's (9: the session id; 10: the token to take the session's lease with; 11
--       counts its messages), then: the call's field, its result JSON, the call lease's token, ttl ms,
--       the next model turn's message ('' = the worker sends it), the call's epoch, the run's entry
--       in the running index (call_begin.lua: the run leaves it in any case), the delivery tag of the
--       message to acknowledge with the step's end ('' = none: end_step.lua)
-- Reply: {{'skipped', why}} | {save reply} (refused: the session's lease is not kept) |
--        {save reply, end_step's reply}
local k = {lease = KEYS[5], dispatched = KEYS[6], results = KEYS[7], attempts = KEYS[8], queue = KEYS[9],
  epoch = KEYS[13]}
local call_lease, parked, abort, running = KEYS[10], KEYS[11], KEYS[12], KEYS[14]
local session, token = ARGV[9], ARGV[10]
local own = 13 + tonumber(ARGV[11]) -- the first argument after save_checkpoint's (its 12: the history entry)
local field, result, call_token, ttl_ms = ARGV[own], ARGV[own + 1], ARGV[own + 2], ARGV[own + 3]
local next_message, epoch, entry, tag = ARGV[own + 4], ARGV[own + 5], ARGV[own + 6], ARGV[own + 7]
redis.call('ZREM', running, entry)
if not same_epoch(k.epoch, epoch) then
  if redis.call('GET', call_lease) == call_token then redis.call('DEL', call_lease) end
  return {{'skipped', 'the session is another incarnation now'}}
end
local committed = redis.call('HSETNX', k.results, field, result) == 1
if redis.call('GET', call_lease) == call_token then redis.call('DEL', call_lease) end
if not committed and redis.call('HGET', k.results, field) ~= result then
  return {{'skipped', 'another result was committed first'}}
end
if not redis.call('SET', k.lease, token, 'NX', 'PX', ttl_ms) then return {{'skipped', 'the lease is busy'}} end
if redis.call('HEXISTS', parked, session) == 1 or redis.call('EXISTS', abort) == 1 then
  redis.call('DEL', k.lease)
  return {{'skipped', 'the session is parked or aborted'}}
end
-- This script checked the epoch and took the lease a moment ago: neither is read again (issue #30).
local saved = save_checkpoint(true)
if saved[1] ~= 'ok' and saved[1] ~= 'done' then
  redis.call('DEL', k.lease)
  return {saved}
end
local known = {current = true, held = true, expiring = tonumber(ARGV[7]) > 0} -- ARGV 7: the store's TTL
local ack = tag ~= '' and {KEYS[15], KEYS[16], tag} or nil
return {saved, end_step(k, token, epoch, '1', {}, '0', next_message, known, ack)}
