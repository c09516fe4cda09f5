-- Take (or refresh) a session's slot among its agent's sessions in flight (issue #29, lousho/fleet/limits.py).
-- Slots whose expiry passed (a dead worker's session, one idle past the slot's TTL) come back first. A session
-- that holds one keeps it; another gets one while fewer than the maximum are held; else it is listed waiting.
-- Reply: 1 held, 0 none free.
-- KEYS: 1 the agent's slots, 2 its waiting set
-- ARGV: 1 the maximum, 2 the session, 3 the slot's TTL (ms), 4 how long a refused session counts as waiting (ms)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if redis.call('ZSCORE', KEYS[1], ARGV[2]) or redis.call('ZCARD', KEYS[1]) < tonumber(ARGV[1]) then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), ARGV[2])
  redis.call('ZREM', KEYS[2], ARGV[2])
  return 1
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), ARGV[2])
return 0
