-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A vendor answered 429 with Retry-After (issue #29): every worker waits on this limit until then, instead of
-- each finding out with a request of its own. Only pushes the wait further, never nearer.
-- KEYS: 1 the limit's hash
-- ARGV: 1 how long to wait (ms), 2 the window (ms), for the hash's expiry
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
local untill = now + tonumber(ARGV[1])
if untill > (tonumber(redis.call('HGET', KEYS[1], 'until')) or 0) then
  redis.call('HSET', KEYS[1], 'until', untill)
  redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[1]) + tonumber(ARGV[2]) * 2 + 60000)
end
return 0
