-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- begin_step(k, token, ttl_ms, session, attempt_field, known, expiring): take a session's lease
-- and read what a step needs, in the same round trip. A library: open_step.lua and
-- call_commit.lua call it.
--
-- needs: read_checkpoint, session_ttl, lousho.worker:epoch
--
-- k: the keys {lease, parked (hash of parked sessions), abort, attempts (hash), results (hash),
-- head, msgs, epoch}. attempt_field: the attempts field to count one more start of ('' = none).
-- known: the writer id the caller holds the transcript of (read_checkpoint.lua). expiring: '1' when
-- the caller's store gives sessions a TTL; '0': no head has one, so none is asked (issue #30).
-- Reply: {0} when someone else holds the lease | {1, parked 0/1, aborted 0/1, attempts (0 when
-- none counted), {field, result, ...} (the committed results hash), {read_checkpoint reply},
-- the session's epoch}
local function begin_step(k, token, ttl_ms, session, attempt_field, known, expiring)
  if not redis.call('SET', k.lease, token, 'NX', 'PX', ttl_ms) then return {0} end
  local parked = redis.call('HEXISTS', k.parked, session)
  local aborted = redis.call('EXISTS', k.abort)
  local epoch = session_epoch(k.epoch)
  local attempts = 0
  if attempt_field ~= '' then attempts = redis.call('HINCRBY', k.attempts, attempt_field, 1) end
  -- The session's keys written since its last save (this count, a result just committed, an abort
  -- flag) expire with its head, when the store has a TTL (session_ttl.lua, issue #16).
  if expiring == '1' then
    local ttl = redis.call('PTTL', k.head)
    if ttl > 0 then expire_session_fleet_keys(k.head, ttl) end
  end
  return {1, parked, aborted, attempts, redis.call('HGETALL', k.results), read_checkpoint(k.head, k.msgs, known), epoch}
end
