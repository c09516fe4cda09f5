-- A step's last round trip when its last save is done already: end_step.lua.
--
-- needs: lousho.worker:end_step
-- KEYS: 1 lease, 2 dispatched, 3 results, 4 attempts, then one call lease per field
-- ARGV: 1 token, 2 clear ('1' / '0'), then one field ('<turn>:<call id>') per call to mark
-- Reply: end_step's
local fields, call_leases = {}, {}
for i = 3, #ARGV do
  fields[#fields + 1] = ARGV[i]
  call_leases[#call_leases + 1] = KEYS[i + 2]
end
local k = {lease = KEYS[1], dispatched = KEYS[2], results = KEYS[3], attempts = KEYS[4]}
return end_step(k, ARGV[1], ARGV[2], fields, call_leases)
