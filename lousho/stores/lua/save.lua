-- Save one checkpoint of one session, all or nothing (RedisStore.save): see save_checkpoint.lua.
--
-- needs: save_checkpoint
-- KEYS and ARGV: save_checkpoint's
return save_checkpoint()
