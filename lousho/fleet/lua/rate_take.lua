-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Take one request and `tokens` estimated tokens from a fleet-wide rate limit (issue #29,
-- lousho/fleet/limits.py). Windows of `window_ms` follow each other: a window starts with the first request
-- after the previous one ended. A request that does not fit waits until the window ends; so does every
-- request while a vendor's 429 asked the fleet to wait (`until`). A request bigger than the whole token
-- limit is let through alone in a fresh window, or it would wait for ever.
-- Reply: {wait_ms, window start}: wait_ms 0 when taken (the count is then the caller's to correct).
-- KEYS: 1 the limit's hash, 2 its waiting set
-- ARGV: 1 requests per window (0: none), 2 tokens per window (0: none), 3 window_ms, 4 tokens,
--       5 the waiter (a session id), 6 how long past its wait a refused waiter still counts as waiting (ms)
local rpm, tpm, window = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
local tokens = tonumber(ARGV[4])
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local state = redis.call('HMGET', KEYS[1], 'start', 'req', 'tok', 'until')
local start, req, tok = tonumber(state[1]), tonumber(state[2]) or 0, tonumber(state[3]) or 0
local blocked = tonumber(state[4]) or 0
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', now)
if blocked > now then
  redis.call('ZADD', KEYS[2], blocked + tonumber(ARGV[6]), ARGV[5])
  return {blocked - now, start or now}
end
if start == nil or now >= start + window then
  start, req, tok = now, 0, 0
end
if (rpm > 0 and req + 1 > rpm) or (tpm > 0 and tok > 0 and tok + tokens > tpm) then
  redis.call('ZADD', KEYS[2], start + window + tonumber(ARGV[6]), ARGV[5])
  return {start + window - now, start}
end
redis.call('HSET', KEYS[1], 'start', start, 'req', req + 1, 'tok', tok + tokens)
redis.call('PEXPIRE', KEYS[1], window * 2 + 60000)
redis.call('ZREM', KEYS[2], ARGV[5])
return {0, start}
