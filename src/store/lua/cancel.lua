-- An operator cancels waiting ticket ARGV[1] (on any replica): it leaves the queue, and its
-- gateway hears it at its next beat. Returns 1 if it was waiting.
local seq = ARGV[1]
local state, gw = unpack(redis.call('HMGET', P .. ':t:' .. seq, 'state', 'gw'))
if state ~= 'waiting' then return 0 end
drop_ticket(seq)
redis.call('RPUSH', P .. ':cancelled:' .. gw, seq)
bump()
return 1
