-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Take a session's lease, count the start of its model turn, and read the checkpoint, the
-- committed results, the parked and abort marks and the session's epoch: a step's first round
-- trip (SessionSteps).
--
-- needs: lousho.worker:begin_step
-- KEYS: 1 lease, 2 parked, 3 abort, 4 attempts, 5 results, 6 head, 7 msgs, 8 epoch
-- ARGV: 1 token, 2 ttl ms, 3 session id, 4 attempts field ('' = none), 5 known writer id, 6 expiring
--       ('1' when the store gives sessions a TTL)
-- Reply: begin_step's
local k = {lease = KEYS[1], parked = KEYS[2], abort = KEYS[3], attempts = KEYS[4], results = KEYS[5],
  head = KEYS[6], msgs = KEYS[7], epoch = KEYS[8]}
local token, ttl_ms, session, attempts_field, writer, expiring = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5], ARGV[6]
return begin_step(k, token, ttl_ms, session, attempts_field, writer, expiring)
