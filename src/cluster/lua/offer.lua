-- Node ARGV[1] offers its worker (slot) ARGV[2], free now, under the new nonce ARGV[3]; it
-- serves the modes ARGV[4] (comma-separated) and is reached at ARGV[5]. ARGV[6] and ARGV[7]
-- are the mode and length in seconds of the session that just ended on it ('' if none).
-- A grant of the slot that was never taken goes back: its ticket waits again in its place.
-- Returns {'assigned', seq}, {'free'} or {'unknown_node'}.
local node, slot, nonce, modes, addr = ARGV[1], ARGV[2], ARGV[3], ARGV[4], ARGV[5]
if not alive(':node', node) then return {'unknown_node'} end
local s = P .. ':slot:' .. slot
local state, old = unpack(redis.call('HMGET', s, 'state', 'ticket'))
if ARGV[6] ~= '' then
  local ema = tonumber(redis.call('HGET', P .. ':ema', ARGV[6]) or ARGV[7])
  redis.call('HSET', P .. ':ema', ARGV[6], 0.8 * ema + 0.2 * tonumber(ARGV[7]))
end
redis.call('HSET', s, 'node', node, 'addr', addr, 'modes', modes, 'nonce', nonce, 'state', 'free', 'since', NOW)
redis.call('HDEL', s, 'ticket', 'mode')
redis.call('SADD', P .. ':slots:' .. node, slot)
for m in each_mode(modes) do redis.call('SADD', P .. ':cap:' .. m, slot) end
if state == 'assigned' and old then unassign(old, slot) end
local seq, mode = head_for(modes)
if seq then
  assign(slot, seq, mode, true)
  return {'assigned', seq}
end
for m in each_mode(modes) do redis.call('ZADD', P .. ':free:' .. m, NOW, slot) end
bump()
return {'free'}
