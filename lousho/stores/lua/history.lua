-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Read a session's history ring and the messages its entries refer to, consistently (RedisStore).
--
-- KEYS: 1 history ring, 2 messages list; ARGV: 1 how many entries (newest first; -1 = all)
-- Replies: {'corrupt', problem} | {'ok', entry count, entry..., message...}: the entries, then the
-- whole messages list (entries share it: each names segments of it).
local hist, msgs = KEYS[1], KEYS[2]
local limit = tonumber(ARGV[1])
for _, key in ipairs({hist, msgs}) do
  local kind = redis.call('TYPE', key)['ok']
  if kind ~= 'none' and kind ~= 'list' then return {'corrupt', key .. ' holds a ' .. kind .. ', not a list'} end
end
local entries = redis.call('LRANGE', hist, 0, limit < 0 and -1 or limit - 1)
local reply = {'ok', #entries}
if #entries == 0 then return reply end
for _, entry in ipairs(entries) do reply[#reply + 1] = entry end
for _, message in ipairs(redis.call('LRANGE', msgs, 0, -1)) do reply[#reply + 1] = message end
return reply
