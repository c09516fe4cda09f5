-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A step's last save and its end in one round trip (RedisCheckpointStore.save(and_then=...)): the
-- checkpoint is saved, fenced on the session's lease, and only if it was, end_step.lua runs.
--
-- needs: save_checkpoint, lousho.worker:end_step
-- KEYS: save_checkpoint's 1-5 (5: the session's lease), then 6 dispatched, 7 results, 8 attempts,
--       9 the broker's queue, 10 epoch, then one call lease per call, then with a delivery tag kombu's
--       unacked hash and its index
-- ARGV: save_checkpoint's (its 10 is the lease token; 11 counts its messages), then as close_step.lua
--       from its 2: the step's epoch, clear, redispatch, the next model turn's message, the delivery
--       tag to acknowledge ('' = none), per call its field and message
-- Reply: {save reply} when the save refused, else {save reply, end_step's reply}
local k = {lease = KEYS[5], dispatched = KEYS[6], results = KEYS[7], attempts = KEYS[8], queue = KEYS[9],
  epoch = KEYS[10]}
local token = ARGV[10]
local own = 13 + tonumber(ARGV[11]) -- the first argument after save_checkpoint's (its 12: the history entry)
local epoch, clear, redispatch, next_message = ARGV[own], ARGV[own + 1], ARGV[own + 2], ARGV[own + 3]
local tag = ARGV[own + 4]
local calls = {}
for i = own + 5, #ARGV, 2 do
  calls[#calls + 1] = {ARGV[i], KEYS[10 + #calls + 1], ARGV[i + 1]}
end
local saved = save_checkpoint()
if saved[1] ~= 'ok' and saved[1] ~= 'done' then return {saved} end
-- A save that passed its fence leaves the lease the token's: end_step does not read it again (issue #30).
-- Nor the epoch: the lease was taken in the script that read the step's epoch (open_step.lua), and
-- making a session again deletes its lease (Client.enqueue), so a lease still ours is that epoch's.
local fenced = token ~= ''
local known = {held = fenced, current = fenced, expiring = tonumber(ARGV[7]) > 0} -- ARGV 7: the store's TTL
local ack = tag ~= '' and {KEYS[#KEYS - 1], KEYS[#KEYS], tag} or nil
return {saved, end_step(k, token, epoch, clear, calls, redispatch, next_message, known, ack)}
