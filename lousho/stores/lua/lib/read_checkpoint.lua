-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- read_checkpoint(cp, msgs, known): one session's latest checkpoint, read consistently (RedisStore).
-- A library: load.lua calls it, and so do the worker's scripts that take a lease and read the
-- checkpoint in the same round trip (lousho/worker/lua/open_step.lua).
--
-- cp: the head key; msgs: the messages list; known: the writer id of the save whose transcript the
-- caller holds already ('' = none).
--
-- needs: segments, typed_call
-- Replies: {'none'} | {'corrupt', problem} | {'known', head}: the caller's transcript is this
-- head's, so no message is sent (a worker that made the last save reads back a few hundred
-- bytes, not the transcript) | {'head', head, message...}: the head and the messages its
-- segments name, in transcript order. A plain checkpoint JSON (no store header) comes back
-- alone; the caller reads its inline messages and reports damage.
--
-- Every read of a head with a digest `h` checks that the list still holds what the head's writers
-- sent: the messages' chained digest must equal `h`, else {'corrupt', ...} (issue #31: a message
-- edited in place, even one that still parses, is never served, cache or not; issue #21: 'known'
-- only then). A head without `h` (an older lousho's) sends its messages, read as they are. The
-- check costs a SHA-1 of the transcript on the server, never a round trip nor bytes on the wire.
local function read_checkpoint(cp, msgs, known)
  local head, wrong = typed_read('GET', cp, 'string') -- the type check is the read (issue #30)
  if wrong then return {'corrupt', wrong} end
  if not head then return {'none'} end
  local header = string.match(head, '^{"%$store":(%b{})')
  if not header then return {'head', head} end
  local ok, meta = pcall(cjson.decode, header)
  if not ok or type(meta) ~= 'table' or type(meta.s) ~= 'table' then return {'head', head} end
  local length, wrong_list = typed_read('LLEN', msgs, 'list')
  if wrong_list then return {'corrupt', wrong_list} end
  local problem = segments_problem(meta.s, length)
  if problem then return {'corrupt', problem} end
  local reply = {'head', head}
  for _, seg in ipairs(meta.s) do
    local part = redis.call('LRANGE', msgs, seg[1], seg[1] + seg[2] - 1)
    for _, message in ipairs(part) do reply[#reply + 1] = message end
  end
  if type(meta.h) == 'string' then
    if chain_digest('', reply, 3, #reply) ~= meta.h then
      return {'corrupt', 'its messages do not hash to the digest its head carries: one was changed, moved or '
        .. 'removed after it was saved'}
    end
    if known ~= '' and meta.w == known then return {'known', head} end
  end
  return reply
end
