-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- A step's last round trip when its last save is done already (or it saved nothing): end_step.lua.
--
-- needs: lousho.worker:end_step
-- KEYS: 1 lease, 2 dispatched, 3 results, 4 attempts, 5 the broker's queue, 6 epoch, then one
--       call lease per call, then with a delivery tag kombu's unacked hash and its index
-- ARGV: 1 token, 2 the step's epoch, 3 clear ('1' / '0'), 4 redispatch ('1' / '0'), 5 the next
--       model turn's message ('' = none), 6 the delivery tag of the message to acknowledge ('' = none),
--       then per call: its field ('<turn>:<call id>') and its message ('' = none)
-- Reply: end_step's
local k = {lease = KEYS[1], dispatched = KEYS[2], results = KEYS[3], attempts = KEYS[4], queue = KEYS[5],
  epoch = KEYS[6]}
local token, epoch, clear, redispatch, next_message, tag = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
local calls = {}
for i = 7, #ARGV, 2 do
  calls[#calls + 1] = {ARGV[i], KEYS[6 + #calls + 1], ARGV[i + 1]}
end
local ack = tag ~= '' and {KEYS[#KEYS - 1], KEYS[#KEYS], tag} or nil
return end_step(k, token, epoch, clear, calls, redispatch, next_message, nil, ack)
