-- A client of gateway ARGV[1] asks for a worker of mode ARGV[2]. ARGV[3] is its ticket
-- number when it already had one (a gateway re-enqueueing its waiting clients after losing
-- the store keeps their order), else ''; ARGV[4] is max_waiting.
-- Returns {'granted', seq, slot, addr, nonce, mode, sig}, {'waiting', seq, position, length},
-- {'full', length}, {'unavailable'} or {'unknown_gateway'}.
local gw, mode, given, max_waiting = ARGV[1], ARGV[2], ARGV[3], tonumber(ARGV[4])
if not alive(':gw', gw) then return {'unknown_gateway'} end
if redis.call('SCARD', P .. ':cap:' .. mode) == 0 then return {'unavailable'} end
local seq = given
if seq == '' then
  local length = redis.call('ZCARD', P .. ':q')
  if length >= max_waiting and free_slot(mode) == nil then return {'full', length} end
  -- Ticket numbers follow the store's clock (microseconds), so that tickets numbered after a
  -- restart of the store still come after those numbered before it.
  local last = tonumber(redis.call('GET', P .. ':seq') or '0')
  local n = math.max(last + 1, tonumber(T[1]) * 1000000 + tonumber(T[2]))
  seq = num(n)
  redis.call('SET', P .. ':seq', seq)
elseif redis.call('EXISTS', P .. ':t:' .. seq) == 1 then
  local state = redis.call('HGET', P .. ':t:' .. seq, 'state')
  if state == 'waiting' then
    return {'waiting', seq, redis.call('ZRANK', P .. ':q', seq) + 1, redis.call('ZCARD', P .. ':q')}
  end
  drop_ticket(seq)
end
redis.call('HSET', P .. ':t:' .. seq, 'gw', gw, 'mode', mode, 'state', 'waiting')
tinfo(seq)
redis.call('SADD', P .. ':gwt:' .. gw, seq)
redis.call('ZADD', P .. ':q', seq, seq)
local grant = place(seq, mode, false)
if grant then
  return {'granted', grant[1], grant[2], grant[3], grant[4], grant[5], grant[6]}
end
return {'waiting', seq, redis.call('ZRANK', P .. ':q', seq) + 1, redis.call('ZCARD', P .. ':q')}
