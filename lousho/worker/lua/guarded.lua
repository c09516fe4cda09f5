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
if not same_epoch(KEYS[1], ARGV[1]) then return -1 end
if ARGV[2] == 'commit' then return redis.call('HSETNX', KEYS[2], ARGV[3], ARGV[4]) end
if ARGV[2] == 'count' then
  local count = redis.call('HINCRBY', KEYS[2], ARGV[3], tonumber(ARGV[4]))
  if count <= 0 then redis.call('HDEL', KEYS[2], ARGV[3]) end
  return count
end
redis.call('HSET', KEYS[2], ARGV[3], ARGV[4])
redis.call('ZREM', KEYS[3], ARGV[5])
return 1
