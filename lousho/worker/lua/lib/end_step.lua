-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- end_step(k, token, epoch, clear, calls, redispatch, next_message, known, ack): a step's last writes. Mark the
-- tool calls about to be sent (their fields in the dispatched hash), drop a completed turn's fleet
-- state, release the session's lease (only if still ours: never another holder's), and push the
-- step's next tasks onto the broker's queue (the outbox: lousho/worker/outbox.py). A library:
-- close_step.lua, save_end.lua and commit_fold.lua call it.
--
-- needs: session_ttl, lousho.worker:epoch
--
-- k: the keys {lease, dispatched, results, attempts, queue, epoch}; epoch: the incarnation the step
-- worked for: if the session is another one now, the step only releases its lease (issue #21).
-- clear: '1' when the checkpoint the step leaves has no pending call (its turn's results, marks and
-- attempt counts go); calls: one {field, lease key, message} per call to send, the message '' when
-- the worker sends it itself; redispatch: '1' to send again calls that were marked before but of
-- which no copy is queued (the mark holds the message pushed, found with LPOS) or running (their
-- lease is held): the reaper's requeue never piles copies onto the queue (issue #21);
-- next_message: the next model turn's message ('' = none, or the worker sends it).
-- known: what the calling script established a moment before, so not read again (issue #30):
-- known.current, the session is still `epoch`; known.held, the lease is `token`'s (a fenced save
-- that passed its fence, or a lease the script took); known.expiring, false when the store gives no
-- session a TTL (the save's ttl argument is 0: no head's TTL is asked). nil: all are read.
-- ack: {kombu's unacked hash, its index, a delivery tag}: the message the step ran for is acknowledged with
-- its end, its record in the broker removed as kombu's ack removes it (lousho/fleet/broker_qos.py); the worker's
-- own ack then has nothing left to write: a round trip a hop less (issue #30). nil: the worker acks as usual.
-- Reply: {released 0/1, send 0/1, ...}: per call, whether it is to be sent (marked for the first
-- time here, or a redispatch of a call nobody runs); a call with a message was pushed already.
local function end_step(k, token, epoch, clear, calls, redispatch, next_message, known, ack)
  known = known or {}
  local reply = {0}
  local current = known.current or same_epoch(k.epoch, epoch)
  for _, call in ipairs(calls) do
    local send = false
    if current then
      local mark = call[3] ~= '' and call[3] or '1'
      send = redis.call('HSETNX', k.dispatched, call[1], mark) == 1
      if not send and redispatch == '1' then
        local queued = redis.call('HGET', k.dispatched, call[1])
        queued = queued and queued ~= '1' and redis.call('LPOS', k.queue, queued) ~= false
        send = not queued and (redis.call('EXISTS', call[2]) == 0 or stale_lease(call[2], epoch))
        if send then redis.call('HSET', k.dispatched, call[1], mark) end
      end
    end
    if send and call[3] ~= '' then redis.call('LPUSH', k.queue, call[3]) end
    reply[#reply + 1] = send and 1 or 0
  end
  if current and clear == '1' then
    redis.call('DEL', k.dispatched, k.results, k.attempts)
  elseif #calls > 0 and known.expiring ~= false then
    follow_head_ttl(k.dispatched, 'dispatched') -- the marks expire with the session (issue #16)
  end
  if known.held or redis.call('GET', k.lease) == token then reply[1] = redis.call('DEL', k.lease) end
  if current and next_message ~= '' then redis.call('LPUSH', k.queue, next_message) end
  if ack then
    redis.call('HDEL', ack[1], ack[3])
    redis.call('ZREM', ack[2], ack[3])
  end
  return reply
end
