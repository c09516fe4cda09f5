-- end_step(k, token, clear, fields, call_leases): a step's last writes. Mark the tool calls about to
-- be sent (`fields` in the dispatched hash), drop a completed turn's fleet state, and release the
-- session's lease (only if still ours: never another holder's). A library: step_end.lua and
-- save_end.lua call it.
--
-- k: the keys {lease, dispatched, results, attempts}; clear: '1' when the checkpoint the step
-- leaves has no pending call (its turn's results, marks and attempt counts go); call_leases[i]:
-- the lease key of fields[i]'s call.
-- Reply: {released 0/1, first 0/1, running 0/1, ...}: per call, marked for the first time here,
-- and whether someone holds its lease
local function end_step(k, token, clear, fields, call_leases)
  local reply = {0}
  for i, field in ipairs(fields) do
    reply[#reply + 1] = redis.call('HSETNX', k.dispatched, field, '1')
    reply[#reply + 1] = redis.call('EXISTS', call_leases[i])
  end
  if clear == '1' then redis.call('DEL', k.dispatched, k.results, k.attempts) end
  if redis.call('GET', k.lease) == token then reply[1] = redis.call('DEL', k.lease) end
  return reply
end
