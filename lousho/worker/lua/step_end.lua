-- A step's last round trip when its last save is done already (or it saved nothing): end_step.lua.
--
-- needs: lousho.worker:end_step
-- KEYS: 1 lease, 2 dispatched, 3 results, 4 attempts, 5 the broker's queue, then one call lease per call
-- ARGV: 1 token, 2 clear ('1' / '0'), 3 redispatch ('1' / '0'), 4 the next model turn's message
--       ('' = none), then per call: its field ('<turn>:<call id>') and its message ('' = none)
-- Reply: end_step's
local calls = {}
for i = 5, #ARGV, 2 do
  calls[#calls + 1] = {ARGV[i], KEYS[5 + #calls + 1], ARGV[i + 1]}
end
local k = {lease = KEYS[1], dispatched = KEYS[2], results = KEYS[3], attempts = KEYS[4], queue = KEYS[5]}
return end_step(k, ARGV[1], ARGV[2], calls, ARGV[3], ARGV[4])
