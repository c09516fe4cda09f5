-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Correct a taken request's estimated tokens with what the answer used (issue #29), in the window it was
-- taken in; a window that ended since is left alone (its count no longer limits anyone). Never below 0.
-- KEYS: 1 the limit's hash
-- ARGV: 1 the window start the request was taken in, 2 the correction (real - estimated tokens)
if redis.call('HGET', KEYS[1], 'start') == ARGV[1] then
  local tok = redis.call('HINCRBY', KEYS[1], 'tok', ARGV[2])
  if tok < 0 then
    redis.call('HSET', KEYS[1], 'tok', 0)
  end
  return 1
end
return 0
