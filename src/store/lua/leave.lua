-- Ticket ARGV[1] leaves (its client left, or an operator cancelled it). A grant it held and
-- did not take is given again by its node (new nonce) when its attach deadline passes.
-- Returns 1 if it was waiting.
local seq = ARGV[1]
local state = redis.call('HGET', P .. ':t:' .. seq, 'state')
drop_ticket(seq)
bump()
if state == 'waiting' then return 1 end
return 0
