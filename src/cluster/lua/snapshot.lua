-- What every replica needs for positions and ETAs, read at one instant: {ver, now ms, the
-- tickets in queue order, "MODE GW STATE" of each (same order; '' if unknown), slots {slot,
-- node, modes, state, mode, since}... (flattened), ema {chat, video, audio} ('' where unknown)}.
-- Only slots of live nodes count. A few commands whatever the queue's length (no per-ticket call).
local tickets = redis.call('ZRANGE', P .. ':q', 0, -1)
local infos = {}
for i = 1, #tickets, 1000 do
  local chunk = {}
  for j = i, math.min(i + 999, #tickets) do chunk[#chunk + 1] = tickets[j] end
  local got = redis.call('HMGET', P .. ':tinfo', unpack(chunk))
  for j = 1, #chunk do infos[#infos + 1] = got[j] or '' end
end
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
return {redis.call('GET', P .. ':ver') or '0', num(NOW), tickets, infos, slots, ema}
