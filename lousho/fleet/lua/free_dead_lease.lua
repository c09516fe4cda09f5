-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Free a lease (a tool call's, or its session's) that a dead worker process holds (issue #20,
-- lousho/fleet/liveness.py).
-- Only if that process still holds it: a token '<host>|<pid>-<uuid>@<epoch>' that starts with its host and
-- pid; a lease another process took since (on this host or another) is left alone. Reply: 1 freed, 0 not.
-- KEYS: 1 the lease
-- ARGV: 1 the dead process's token prefix ('<host>|<pid>-')
local lease = KEYS[1]
local prefix = ARGV[1]
local holder = redis.call('GET', lease)
if holder and string.sub(holder, 1, #prefix) == prefix then
  redis.call('DEL', lease)
  return 1
end
return 0
