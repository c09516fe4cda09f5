-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Take entries off a queue for a worker's channel (lousho/fleet/transport.py, issue #29): the entry its BRPOP
-- returned, and up to ARGV[2] more off the same list, each recorded among kombu's unacknowledged messages in this
-- same step (the record kombu's QoS.append writes, `[message, exchange, routing key]`, and the tag in the index).
-- So no entry is ever off the queue without its record: a worker killed at any point after this leaves each one
-- to be restored after the visibility timeout. An entry that is no kombu message with a delivery tag, exchange
-- and routing key is returned unrecorded (tag ''): the channel delivers it the kombu way, or moves it aside.
-- KEYS: 1 the queue's list, 2 kombu's `unacked` hash, 3 its index (`unacked_index`)
-- ARGV: 1 the entry BRPOP returned, 2 how many more to take, 3 now (the index's score, seconds)
-- Reply: entry, tag, entry, tag, ... oldest first
local function record(entry, now)
  local ok, message = pcall(cjson.decode, entry)
  if not ok or type(message) ~= 'table' or type(message.properties) ~= 'table' then
    return ''
  end
  local properties = message.properties
  local tag, delivery = properties.delivery_tag, properties.delivery_info
  if type(tag) ~= 'string' or tag == '' or type(delivery) ~= 'table'
      or type(delivery.exchange) ~= 'string' or type(delivery.routing_key) ~= 'string' then
    return ''
  end
  local kept = '[' .. entry .. ',' .. cjson.encode(delivery.exchange) .. ',' .. cjson.encode(delivery.routing_key) .. ']'
  redis.call('HSET', KEYS[2], tag, kept)
  redis.call('ZADD', KEYS[3], now, tag)
  return tag
end

local now = ARGV[3]
local reply = {ARGV[1], record(ARGV[1], now)}
local more = tonumber(ARGV[2])
if more > 0 then
  local taken = redis.call('RPOP', KEYS[1], more)
  if taken then
    for _, entry in ipairs(taken) do
      reply[#reply + 1] = entry
      reply[#reply + 1] = record(entry, now)
    end
  end
end
return reply
