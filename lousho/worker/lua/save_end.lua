-- A step's last save and its end in one round trip (RedisStore.save(and_then=...)): the checkpoint
-- is saved, fenced on the session's lease, and only if it was, end_step.lua runs.
--
-- needs: save_checkpoint, lousho.worker:end_step
-- KEYS: save_checkpoint's 1-5 (5: the session's lease), then 6 dispatched, 7 results, 8 attempts,
--       then one call lease per field
-- ARGV: save_checkpoint's (its 10 is the lease token; 11 counts its messages), then: clear, fields
-- Reply: {save reply} when the save refused, else {save reply, end_step's reply}
local saved = save_checkpoint()
if saved[1] ~= 'ok' and saved[1] ~= 'done' then return {saved} end
local own = 12 + tonumber(ARGV[11])
local fields, call_leases = {}, {}
for i = own + 1, #ARGV do
  fields[#fields + 1] = ARGV[i]
  call_leases[#call_leases + 1] = KEYS[8 + #fields]
end
local k = {lease = KEYS[5], dispatched = KEYS[6], results = KEYS[7], attempts = KEYS[8]}
return {saved, end_step(k, ARGV[10], ARGV[own], fields, call_leases)}
