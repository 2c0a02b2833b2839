-- Node ARGV[1] offers its worker (slot) ARGV[2], free now, under the new nonce ARGV[3]; it
-- serves the modes ARGV[4] (comma-separated) and is reached at ARGV[5]. ARGV[6] and ARGV[7]
-- are the mode and length in seconds of the session that just ended on it ('' if none); ARGV[8]
-- the gateways that keep a link open to the node (comma-separated): a grant for one of their
-- tickets is not put on the gateway's list, the node pushes it on such a link. ARGV[9] is the
-- node's signature of the offer (slot, address, nonce), carried to its grant.
-- A grant of the slot that was never taken goes back: its ticket waits again in its place.
-- Returns {'assigned', seq} (on the gateway's list), {'assigned', seq, gw, mode} (for the
-- node to push), {'free'} or {'unknown_node'}.
local node, slot, nonce, modes, addr = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not alive(':node', node) then return {'unknown_node'} end
local s = P .. ':slot:' .. slot
local state, old = unpack(redis.call('HMGET', s, 'state', 'ticket'))
if ARGV[6] ~= '' then
  local ema = tonumber(redis.call('HGET', P .. ':ema', ARGV[6]) or ARGV[7])
  redis.call('HSET', P .. ':ema', ARGV[6], 0.8 * ema + 0.2 * tonumber(ARGV[7]))
end
redis.call('HSET', s, 'node', node, 'addr', addr, 'modes', modes, 'nonce', nonce, 'sig', ARGV[9],
  'state', 'free', 'since', NOW)
redis.call('HDEL', s, 'ticket', 'mode')
redis.call('SADD', P .. ':slots:' .. node, slot)
for m in each_mode(modes) do redis.call('SADD', P .. ':cap:' .. m, slot) end
if state == 'assigned' and old then unassign(old, slot) end
local seq, mode = head_for(modes)
if seq then
  local gw = redis.call('HGET', P .. ':t:' .. seq, 'gw')
  local linked = string.find(',' .. (ARGV[8] or '') .. ',', ',' .. gw .. ',', 1, true) ~= nil
  assign(slot, seq, mode, not linked)
  if linked then return {'assigned', seq, gw, mode} end
  return {'assigned', seq}
end
for m in each_mode(modes) do redis.call('ZADD', P .. ':free:' .. m, NOW, slot) end
bump()
return {'free'}
