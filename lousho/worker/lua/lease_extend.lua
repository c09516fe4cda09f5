-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Extend a lease only while we still hold it (compare the token, then PEXPIRE).
-- KEYS: 1 lease   ARGV: 1 token, 2 ttl ms      Reply: 1 extended, 0 lost
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('PEXPIRE', KEYS[1], tonumber(ARGV[2]))
end
return 0
