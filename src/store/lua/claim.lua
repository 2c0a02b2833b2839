-- The gateway's session took its grant (the node admitted it): ticket ARGV[1] leaves the queue
-- and the slot is busy. Returns 1, or 0 if the ticket was no longer assigned (the node's
-- admission is what counts; this only keeps the store's view right).
local seq = ARGV[1]
local t = P .. ':t:' .. seq
local state, slot, mode = unpack(redis.call('HMGET', t, 'state', 'slot', 'mode'))
drop_ticket(seq)
bump()
if state ~= 'assigned' or not slot then return 0 end
local s = P .. ':slot:' .. slot
if redis.call('HGET', s, 'ticket') == seq then
  redis.call('HSET', s, 'state', 'busy', 'mode', mode, 'since', NOW)
  redis.call('HDEL', s, 'ticket')
end
return 1
