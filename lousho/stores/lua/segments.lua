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
