-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- One heartbeat of one piece of work in flight (a step, or a tool call's run): extend its lease while we still
-- hold it, push the session's in-flight deadline, mark the call's run alive, and read the session's abort flag.
-- A worker's heart sends the beats that are due on one event loop in one pipeline of these (issue #29: five
-- round trips a beat, for each of hundreds of calls in flight, were most of a waiting worker's Redis work).
-- Every key is in the session's hash slot (the index keys are its shards): one script per session on a Cluster.
-- KEYS: 1 the lease, 2 the in-flight index, 3 the running index, 4 the session's abort flag
-- ARGV: 1 the lease's token, 2 its TTL (ms), 3 the session, 4 the in-flight deadline (ms from now),
--       5 the call's run entry in the running index ('' for a step)
-- Reply: -1 the lease is lost (nothing done: another worker's to push), 0 beaten, 1 beaten and the session aborted
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  return -1
end
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[3])
if ARGV[5] ~= '' then
  redis.call('ZADD', KEYS[3], 'XX', now, ARGV[5])
end
return redis.call('EXISTS', KEYS[4])
