-- What every replica needs for positions and ETAs, read at one instant:
-- {ver, now ms, tickets {seq, mode, gw, state}..., slots {slot, node, modes, state, mode,
-- since}..., ema {chat, video, audio}} (flattened; ema '' where unknown). Only slots of live
-- nodes count.
local tickets, slots = {}, {}
for _, seq in ipairs(redis.call('ZRANGE', P .. ':q', 0, -1)) do
  local mode, gw, state = unpack(redis.call('HMGET', P .. ':t:' .. seq, 'mode', 'gw', 'state'))
  if mode then
    table.insert(tickets, seq); table.insert(tickets, mode)
    table.insert(tickets, gw); table.insert(tickets, state)
  end
end
for _, node in ipairs(redis.call('ZRANGEBYSCORE', P .. ':node', NOW, '+inf')) do
  for _, slot in ipairs(redis.call('SMEMBERS', P .. ':slots:' .. node)) do
    local modes, state, mode, since =
      unpack(redis.call('HMGET', P .. ':slot:' .. slot, 'modes', 'state', 'mode', 'since'))
    if modes then
      table.insert(slots, slot); table.insert(slots, node); table.insert(slots, modes)
      table.insert(slots, state or 'down'); table.insert(slots, mode or ''); table.insert(slots, since or '0')
    end
  end
end
local ema = redis.call('HMGET', P .. ':ema', 'chat', 'video', 'audio')
for i = 1, 3 do if not ema[i] then ema[i] = '' end end
return {redis.call('GET', P .. ':ver') or '0', num(NOW), tickets, slots, ema}
