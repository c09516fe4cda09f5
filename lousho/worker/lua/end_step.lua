-- end_step(k, token, clear, calls, next_message): a step's last writes. Mark the tool calls about
-- to be sent (their fields in the dispatched hash), drop a completed turn's fleet state, release
-- the session's lease (only if still ours: never another holder's), and push the step's next tasks
-- onto the broker's queue (the outbox: lousho/worker/outbox.py). A library: step_end.lua,
-- save_end.lua and commit_fold.lua call it.
--
-- k: the keys {lease, dispatched, results, attempts, queue}; clear: '1' when the checkpoint the
-- step leaves has no pending call (its turn's results, marks and attempt counts go); calls: one
-- {field, lease key, message} per call to send, the message '' when the worker sends it itself;
-- redispatch: '1' to send calls again that were marked before but whose lease nobody holds;
-- next_message: the next model turn's message ('' = none, or the worker sends it).
-- Reply: {released 0/1, send 0/1, ...}: per call, whether it is to be sent (marked for the first
-- time here, or a redispatch of a call nobody runs); a call with a message was pushed already.
local function end_step(k, token, clear, calls, redispatch, next_message)
  local reply = {0}
  for _, call in ipairs(calls) do
    local first = redis.call('HSETNX', k.dispatched, call[1], '1') == 1
    local send = first or (redispatch == '1' and redis.call('EXISTS', call[2]) == 0)
    if send and call[3] ~= '' then redis.call('LPUSH', k.queue, call[3]) end
    reply[#reply + 1] = send and 1 or 0
  end
  if clear == '1' then redis.call('DEL', k.dispatched, k.results, k.attempts) end
  if redis.call('GET', k.lease) == token then reply[1] = redis.call('DEL', k.lease) end
  if next_message ~= '' then redis.call('LPUSH', k.queue, next_message) end
  return reply
end
