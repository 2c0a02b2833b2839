-- Gateway ARGV[1] is alive for ARGV[2] ms more. Whoever beats also retires what outlived its
-- lease: gateways (their tickets leave) and nodes (their slots go; grants of them not taken
-- go back). Returns {known, cancelled}: known = 0 if the store did not know this gateway (it
-- was retired, or the store restarted): its clients must be enqueued again. cancelled lists
-- its tickets an operator cancelled since the last beat.
local gw, lease = ARGV[1], tonumber(ARGV[2])
local known = alive(':gw', gw) and 1 or 0
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', P .. ':gw', '-inf', '(' .. NOW)) do
  if dead ~= gw then
    for _, seq in ipairs(redis.call('SMEMBERS', P .. ':gwt:' .. dead)) do drop_ticket(seq) end
    redis.call('DEL', P .. ':gwt:' .. dead, P .. ':g:' .. dead)
    redis.call('ZREM', P .. ':gw', dead)
    bump()
  end
end
for _, dead in ipairs(redis.call('ZRANGEBYSCORE', P .. ':node', '-inf', '(' .. NOW)) do
  for _, slot in ipairs(redis.call('SMEMBERS', P .. ':slots:' .. dead)) do retire(slot, true) end
  redis.call('DEL', P .. ':slots:' .. dead)
  redis.call('ZREM', P .. ':node', dead)
end
if known == 0 then
  for _, seq in ipairs(redis.call('SMEMBERS', P .. ':gwt:' .. gw)) do drop_ticket(seq) end
  redis.call('DEL', P .. ':gwt:' .. gw, P .. ':g:' .. gw)
end
redis.call('ZADD', P .. ':gw', NOW + lease, gw)
local cancelled = redis.call('LRANGE', P .. ':cancelled:' .. gw, 0, -1)
redis.call('DEL', P .. ':cancelled:' .. gw)
return {known, cancelled}
