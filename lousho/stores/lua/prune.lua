-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- RedisStore.prune() of one session, atomic with its saves (issue #16).
--
-- KEYS: 1 head, 2 messages list, 3 history ring, 4.. the fleet's keys of the session (RedisKeys.run_keys),
--       deleted with its head: a finished run's results, marks and counts are of no use after it
-- ARGV: 1 the cutoff, ms (the Redis server's time, as the saves' `t`)
-- Reply: {1 if the head was removed else 0, history entries dropped}
--
-- A head goes when it is 'finished' and was saved before the cutoff; an unfinished session is never
-- pruned. The ring is newest first, so the entries saved before the cutoff are its tail. The messages
-- go when neither a head nor an entry is left to name them. A key of the wrong type, or a head or an
-- entry without a save time (an older lousho's, or a raw write), is left as it is.
local cp, msgs, hist = KEYS[1], KEYS[2], KEYS[3]
local cutoff = tonumber(ARGV[1])

local function saved_ms(record)
  local header = string.match(record, '^{"%$store":(%b{})')
  if not header then return nil end
  local ok, meta = pcall(cjson.decode, header)
  if ok and type(meta) == 'table' and type(meta.t) == 'number' then return meta.t end
  return nil
end

local removed = 0
if redis.call('TYPE', cp)['ok'] == 'string' then
  local head = redis.call('GET', cp)
  local t = saved_ms(head)
  if t and t < cutoff then
    local ok, body = pcall(cjson.decode, head)
    if ok and type(body) == 'table' and body.status == 'finished' then
      redis.call('DEL', cp)
      for i = 4, #KEYS do redis.call('DEL', KEYS[i]) end
      removed = 1
    end
  end
end

local dropped = 0
if redis.call('TYPE', hist)['ok'] == 'list' then
  local entries = redis.call('LRANGE', hist, 0, -1)
  local kept = 0
  for _, entry in ipairs(entries) do
    local t = saved_ms(entry)
    if t == nil or t < cutoff then break end
    kept = kept + 1
  end
  dropped = #entries - kept
  if kept == 0 then redis.call('DEL', hist) elseif dropped > 0 then redis.call('LTRIM', hist, 0, kept - 1) end
end

if redis.call('EXISTS', cp) == 0 and redis.call('EXISTS', hist) == 0 then redis.call('DEL', msgs) end
return {removed, dropped}
