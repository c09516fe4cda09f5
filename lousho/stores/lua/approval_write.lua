-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Write one approval snapshot if it is still what the caller read (RedisApprovalStore.rewrite): a compare and
-- set, so that the write can be followed by WAIT on the same connection when replicas must confirm it (issue #18;
-- a WATCH transaction hands its connection back before a WAIT could follow). The snapshot is encoded by the
-- caller (JSON, or the payload codec's bytes): Lua only compares and stores it, never re-encodes it.
-- KEYS: 1 the approval, 2 the pending index's shard of its slot
-- ARGV: 1 '1' if the caller read a value, '0' if it read none, '*' to write whatever is there (a save), 2 the
--   value it read, 3 the new value,
--   4 its TTL in ms ('0': none), 5 '1' if the new snapshot is pending, 6 the approval id, 7 its created ms
-- Reply: 1 written, 0 the approval changed since it was read (read again and retry)
local approval, pending_index = KEYS[1], KEYS[2]
local current = redis.call('GET', approval)
if ARGV[1] ~= '*' and ((ARGV[1] == '1') ~= (current ~= false) or (current ~= false and current ~= ARGV[2])) then
  return 0
end
if ARGV[4] ~= '0' then
  redis.call('SET', approval, ARGV[3], 'PX', ARGV[4])
else
  redis.call('SET', approval, ARGV[3])
end
if ARGV[5] == '1' then
  redis.call('ZADD', pending_index, ARGV[7], ARGV[6])
else
  redis.call('ZREM', pending_index, ARGV[6])
end
return 1
