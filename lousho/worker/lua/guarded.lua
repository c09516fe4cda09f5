-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- One write of a step's outside its first and last scripts, made only while the session is still
-- the incarnation the step read (epoch.lua, issue #21): a committed result (a preset result, a
-- rejection, 'cancelled'), a counted start, a parked mark.
--
-- needs: lousho.worker:epoch
-- KEYS: 1 epoch, 2 the hash written, 3 the in-flight index (for 'park')
-- ARGV: 1 the step's epoch, 2 what: 'commit' | 'count' | 'park', 3 the field, 4 the value (the
--       result JSON, the count's increment, the park reason), 5 the session id (for 'park')
-- Reply: -1 when the session is another incarnation now, else what the write replied (HSETNX's
--        0/1, HINCRBY's new count, 1 for a park)
local epoch_key, hash, inflight = KEYS[1], KEYS[2], KEYS[3]
local epoch, what, field, value, session = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not same_epoch(epoch_key, epoch) then return -1 end
if what == 'commit' then return redis.call('HSETNX', hash, field, value) end
if what == 'count' then
  local count = redis.call('HINCRBY', hash, field, tonumber(value))
  if count <= 0 then redis.call('HDEL', hash, field) end
  return count
end
redis.call('HSET', hash, field, value)
redis.call('ZREM', inflight, session)
return 1
