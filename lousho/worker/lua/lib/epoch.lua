-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A session's incarnation (issue #21): an epoch set when the session is created and read, with the
-- checkpoint, by every step's first script. Every later write of that step checks it is still the
-- session's: work of an earlier incarnation (a session deleted and enqueued again under the same
-- id while a worker still ran its old step) commits nothing and stands nothing down.
-- A library: the worker's scripts call it.
--
-- session_epoch(key): the session's epoch; '' for a session that has none (made in process, or
-- before epochs: nothing is written for it, so a damaged session's keys stay as they were).
-- same_epoch(key, epoch): whether `epoch` is still the session's.
-- stale_lease(key, epoch): whether the lease at `key` is held for another incarnation (its token
-- ends in '@<epoch>'), so the current incarnation may take it over.
local function session_epoch(key)
  return redis.call('GET', key) or ''
end

local function same_epoch(key, epoch)
  return session_epoch(key) == epoch
end

local function stale_lease(key, epoch)
  local holder = redis.call('GET', key)
  return holder ~= false and string.sub(holder, -(#epoch + 1)) ~= '@' .. epoch
end
