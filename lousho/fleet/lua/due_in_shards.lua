#!lua flags=allow-cross-slot-keys,no-writes
-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- The due entries of many in-flight index shards of one Redis Cluster node, in one call (issue #18): a reaper
-- pass reads 16,384 shards, and a command each costs the client (redis-py) far more than the server. The
-- shards come as arguments, all of slots the node the call is sent to serves; `allow-cross-slot-keys` (Redis
-- 7) lets one script read keys of several of its slots. A server that refuses it (Redis 6, a slot that moved)
-- fails the call: the caller then pipelines a command per shard.
-- KEYS: one of the shards (it routes the call)   ARGV: 1 the exclusive upper bound ('(<ms>'), 2 the most
--   entries per shard (0: all), 3.. the shards
-- Reply: {member, score, member, score, ...} over every shard
local before, limit = ARGV[1], tonumber(ARGV[2])
local out = {}
for i = 3, #ARGV do
  local rows
  if limit > 0 then
    rows = redis.call('ZRANGEBYSCORE', ARGV[i], '-inf', before, 'WITHSCORES', 'LIMIT', 0, limit)
  else
    rows = redis.call('ZRANGEBYSCORE', ARGV[i], '-inf', before, 'WITHSCORES')
  end
  for j = 1, #rows do out[#out + 1] = rows[j] end
end
return out
