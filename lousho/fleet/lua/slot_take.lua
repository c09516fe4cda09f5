-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Take (or refresh) a session's slot among its agent's sessions in flight (issue #29, lousho/fleet/limits.py).
-- Slots whose expiry passed (a dead worker's session, one idle past the slot's TTL) come back first. A session
-- that holds one keeps it. Free slots go to waiting sessions in the order they first waited (a session arriving
-- later does not take a slot from under one that waits); a waiter that stopped asking (its waiting expired) loses
-- its place. A session refused is listed waiting, and queued if it was not.
-- Reply: 1 held, 0 none free.
-- KEYS: 1 the agent's slots (session -> expiry), 2 its waiting set (session -> until when it counts as waiting),
--       3 its queue (session -> when it first waited)
-- ARGV: 1 the maximum, 2 the session, 3 the slot's TTL (ms), 4 how long a refused session counts as waiting (ms)
local session = ARGV[2]
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
redis.call('ZREMRANGEBYSCORE', KEYS[1], '-inf', now)
for _, gone in ipairs(redis.call('ZRANGEBYSCORE', KEYS[2], '-inf', now)) do
  redis.call('ZREM', KEYS[2], gone)
  redis.call('ZREM', KEYS[3], gone)
end
local held = redis.call('ZSCORE', KEYS[1], session)
local free = tonumber(ARGV[1]) - redis.call('ZCARD', KEYS[1])
if not held and free > 0 then
  local ahead = redis.call('ZRANK', KEYS[3], session) or redis.call('ZCARD', KEYS[3])
  held = ahead < free
end
if held then
  redis.call('ZADD', KEYS[1], now + tonumber(ARGV[3]), session)
  redis.call('ZREM', KEYS[2], session)
  redis.call('ZREM', KEYS[3], session)
  return 1
end
redis.call('ZADD', KEYS[2], now + tonumber(ARGV[4]), session)
redis.call('ZADD', KEYS[3], 'NX', now, session)
return 0
