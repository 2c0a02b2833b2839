-- The node refused grant (ARGV[1], nonce ARGV[2]) (a stale nonce: the node gave the slot
-- again meanwhile): the ticket waits again, in its place. Returns 1 if it did.
local seq, nonce = ARGV[1], ARGV[2]
if redis.call('HGET', P .. ':t:' .. seq, 'nonce') ~= nonce then return 0 end
unassign(seq)
return 1
