-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A command with its key-type check folded in (issue #30): the command itself is the check, so a key of
-- the expected type (or none) costs one command, not TYPE and the command. A library: read_checkpoint.lua
-- and save_checkpoint.lua read (and save_checkpoint.lua writes its first writes) with it.
--
-- typed_call(want, command, key, ...): the command's reply (false for a missing key's GET, as redis.call
-- gives it), or nil and what is wrong ('<key> holds a <type>, not a <want>': TYPE is asked only then).
-- Any other error is raised. typed_read(command, key, want): the same, for a read of one key.
local function typed_call(want, command, key, ...)
  local reply = redis.pcall(command, key, ...)
  if type(reply) == 'table' and reply.err then
    if not string.find(reply.err, 'WRONGTYPE', 1, true) then error(reply.err) end
    return nil, key .. ' holds a ' .. redis.call('TYPE', key)['ok'] .. ', not a ' .. want
  end
  return reply
end

local function typed_read(command, key, want)
  return typed_call(want, command, key)
end
