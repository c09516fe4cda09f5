-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A session's TTL over every key of the session (RedisStore(ttl_s=...), issue #16). A library:
-- save_checkpoint.lua gives it at every save, and the fleet's scripts that create a session key
-- between saves (lousho/worker/lua/lib/begin_step.lua, end_step.lua) give it the head's.
--
-- Every key of a session is `<prefix>{<session>}:<part>` (RedisKeys.session_key), so the head's name
-- and the fleet's keys are named from any one of them. The fleet's keys are not all among a script's
-- KEYS; they share its keys' hash tag, so its slot: this store targets a standalone Redis or one
-- primary (redis_checkpoints.py). The leases are not here: they expire by their own PX.
local SESSION_FLEET_PARTS = {'results', 'dispatched', 'attempts', 'abort', 'epoch'}

-- The prefix every key of the session of `key` (its key `part`) starts with: '<prefix>{<session>}:'.
local function session_base(key, part)
  return string.sub(key, 1, #key - #part)
end

-- expire_session_fleet_keys(head, ttl_ms): the fleet's keys of the head's session that exist live
-- `ttl_ms` from now, as the head does after a save (PEXPIRE on a missing key does nothing).
local function expire_session_fleet_keys(head, ttl_ms)
  local base = session_base(head, 'cp')
  for _, part in ipairs(SESSION_FLEET_PARTS) do redis.call('PEXPIRE', base .. part, ttl_ms) end
end

-- follow_head_ttl(key, part): `key` (the session's key `part`) expires when the session's head does;
-- nothing when the head has no TTL (the store has none) or is gone.
local function follow_head_ttl(key, part)
  local ttl = redis.call('PTTL', session_base(key, part) .. 'cp')
  if ttl > 0 then redis.call('PEXPIRE', key, ttl) end
end
