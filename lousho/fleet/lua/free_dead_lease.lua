-- Free a lease (a tool call's, or its session's) that a dead worker process holds (issue #20,
-- lousho/fleet/liveness.py).
-- Only if that process still holds it: a token '<pid>-<uuid>@<epoch>' that starts with its pid; a
-- lease another process took since is left alone. Reply: 1 freed, 0 not.
-- KEYS: 1 the lease
-- ARGV: 1 the dead process's token prefix ('<pid>-')
local lease = KEYS[1]
local prefix = ARGV[1]
local holder = redis.call('GET', lease)
if holder and string.sub(holder, 1, #prefix) == prefix then
  redis.call('DEL', lease)
  return 1
end
return 0
