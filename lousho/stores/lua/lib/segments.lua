-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- segments_problem(segs, list_length): what is wrong with a store header's segments (each
-- {start, count} of the session's messages list), or nil. A library: read_checkpoint.lua and
-- save_checkpoint.lua check a head with it before they trust it.
local function segments_problem(segs, list_length)
  for _, seg in ipairs(segs) do
    if type(seg) ~= 'table' or type(seg[1]) ~= 'number' or type(seg[2]) ~= 'number' then
      return 'its store header is damaged'
    end
    if seg[1] + seg[2] > list_length then
      return 'its messages list is shorter than its head says (deleted or expired?)'
    end
  end
  return nil
end

-- chain_digest(digest, messages, first, last): `digest` extended by messages[first..last], one
-- SHA-1 per message (sha1(digest .. message)), so a save extends its head's digest `h` by its new
-- messages alone and a reader recomputes it from the list. '' is the digest of no message.
-- Issue #21: a process that holds a session's transcript reads back only the head; the digest
-- lets read_checkpoint see, on the server, that the list still holds what the head's writers sent.
local function chain_digest(digest, messages, first, last)
  for i = first, last do digest = redis.sha1hex(digest .. messages[i]) end
  return digest
end
