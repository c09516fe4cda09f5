-- protocol: 1 (lousho.formats.SCRIPT_PROTOCOL: the rules this script keeps with the others; issue #35)
-- Save one checkpoint of one session, all or nothing (RedisStore.save): see save_checkpoint.lua.
--
-- needs: save_checkpoint
-- KEYS and ARGV: save_checkpoint's
return save_checkpoint()
