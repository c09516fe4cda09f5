-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Push a held slot's expiry (issue #29): a heartbeat of the session's work. A slot given back or expired is
-- not taken again here: only a model turn takes one (slot_take.lua).
-- KEYS: 1 the agent's slots
-- ARGV: 1 the session, 2 the slot's TTL (ms)
local time = redis.call('TIME')
local now = tonumber(time[1]) * 1000 + math.floor(tonumber(time[2]) / 1000)
return redis.call('ZADD', KEYS[1], 'XX', 'GT', now + tonumber(ARGV[2]), ARGV[1])
