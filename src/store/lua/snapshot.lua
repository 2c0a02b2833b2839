-- What every replica needs for ETAs, read at one instant with the tickets (the caller reads
-- P:tinfo by HGETALL in the same MULTI: a plain command, not copied through Lua): {ver, now ms,
-- slots {slot, node, modes, state, mode, since}... (flattened), ema {chat, video, audio} (''
-- where unknown)}. Only slots of live nodes count. A few commands per node and slot, whatever
-- the queue's length.
local slots = {}
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
return {redis.call('GET', P .. ':ver') or '0', num(NOW), slots, ema}
