-- A step's last round trip: mark the tool calls it is about to send, forget a completed turn's
-- fleet state, and release the session's lease (only if still ours: never another holder's).
--
-- KEYS: 1 lease, 2 dispatched, 3 results, 4 attempts, then one call lease per call to mark
-- ARGV: 1 token, 2 '1' when the checkpoint this step leaves has no pending call (its turn is
--       complete: its results, marks and attempt counts are dropped), then one field per call
-- Reply: {released 0/1, first 0/1, running 0/1, ... (per call: marked for the first time here,
--        and whether someone holds the call's lease)}
local reply = {0}
for i = 3, #ARGV do
  reply[#reply + 1] = redis.call('HSETNX', KEYS[2], ARGV[i], '1')
  reply[#reply + 1] = redis.call('EXISTS', KEYS[i + 2])
end
if ARGV[2] == '1' then redis.call('DEL', KEYS[2], KEYS[3], KEYS[4]) end
if redis.call('GET', KEYS[1]) == ARGV[1] then reply[1] = redis.call('DEL', KEYS[1]) end
return reply
