-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Read one session's latest checkpoint in one round trip (RedisStore.load): see read_checkpoint.lua.
--
-- needs: read_checkpoint
-- KEYS: 1 head, 2 messages list
-- ARGV: 1 the writer id of the save whose transcript the caller holds already ('' = none)
return read_checkpoint(KEYS[1], KEYS[2], ARGV[1] or '')
