-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Release a lease only if we still hold it: never delete a lease another worker took over.
-- KEYS: 1 lease   ARGV: 1 token      Reply: 1 released, 0 not ours
if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
