-- Shared by every script (prepended to each). KEYS[1] is the prefix with its hash tag, e.g.
-- "{og}": every key starts with it, so all of them live in one slot of a Redis Cluster.
--
-- Keys: P:seq (last ticket number), P:ver (bumped on every change), P:q (zset, every ticket not
-- yet claimed, by number: positions), P:q:MODE (zset, tickets of MODE waiting for a worker),
-- P:t:N (hash: gw, mode, state waiting|assigned, slot, nonce, addr), P:tinfo (hash N -> "MODE GW
-- STATE": what a view needs of every ticket, read in one command), P:gw (zset, gateway ->
-- lease deadline ms), P:gwt:GW (set, its tickets), P:g:GW (list, grants for it), P:node (zset,
-- node -> deadline), P:slots:NODE (set, its slots), P:slot:S (hash: node, addr, modes, state
-- free|assigned|busy|down, nonce, ticket, mode, since), P:free:MODE (zset, free slots serving
-- MODE, by free-since), P:cap:MODE (set, slots able to serve MODE), P:ema (hash mode -> s).
local P = KEYS[1]
local T = redis.call('TIME')
local NOW = tonumber(T[1]) * 1000 + math.floor(tonumber(T[2]) / 1000)
local MODES = {'chat', 'video', 'audio'}

local function num(n) return string.format('%.0f', n) end
local function bump() redis.call('INCR', P .. ':ver') end
local function alive(zset, id)
  local d = redis.call('ZSCORE', P .. zset, id)
  return d ~= false and tonumber(d) >= NOW
end
local function each_mode(csv)
  return string.gmatch(csv, '[^,]+')
end
local function unfree(slot)
  for _, m in ipairs(MODES) do redis.call('ZREM', P .. ':free:' .. m, slot) end
end

-- Records what a view shows of ticket `seq` (its hash `t` is up to date).
local function tinfo(seq)
  local mode, gw, state = unpack(redis.call('HMGET', P .. ':t:' .. seq, 'mode', 'gw', 'state'))
  redis.call('HSET', P .. ':tinfo', seq, mode .. ' ' .. gw .. ' ' .. state)
end

-- Removes a ticket everywhere.
local function drop_ticket(seq)
  local t = P .. ':t:' .. seq
  local mode, gw = unpack(redis.call('HMGET', t, 'mode', 'gw'))
  if mode then redis.call('ZREM', P .. ':q:' .. mode, seq) end
  if gw then redis.call('SREM', P .. ':gwt:' .. gw, seq) end
  redis.call('ZREM', P .. ':q', seq)
  redis.call('HDEL', P .. ':tinfo', seq)
  redis.call('DEL', t)
end

-- Gives `slot` (offered by its node with its current nonce) to ticket `seq`. The grant goes to
-- the ticket's gateway's list unless the caller returns it itself.
local function assign(slot, seq, mode, push)
  local s, t = P .. ':slot:' .. slot, P .. ':t:' .. seq
  local nonce, addr, sig = unpack(redis.call('HMGET', s, 'nonce', 'addr', 'sig'))
  redis.call('ZREM', P .. ':q:' .. mode, seq)
  redis.call('HSET', t, 'state', 'assigned', 'slot', slot, 'nonce', nonce, 'addr', addr)
  tinfo(seq)
  redis.call('HSET', s, 'state', 'assigned', 'ticket', seq, 'since', NOW)
  unfree(slot)
  local grant = {seq, slot, addr, nonce, mode, sig or '-'}
  if push then
    local gw = redis.call('HGET', t, 'gw')
    redis.call('RPUSH', P .. ':g:' .. gw, table.concat(grant, ' '))
  end
  bump()
  return grant
end

-- The oldest free slot of a live node serving `mode`, or nil (free slots of dead nodes go).
local function free_slot(mode)
  while true do
    local head = redis.call('ZRANGE', P .. ':free:' .. mode, 0, 0)
    if #head == 0 then return nil end
    local node = redis.call('HGET', P .. ':slot:' .. head[1], 'node')
    if node and alive(':node', node) then return head[1] end
    unfree(head[1])
  end
end

-- Ticket `seq` waits for a worker: a free one now, else its place in its mode's queue.
local function place(seq, mode, push)
  local slot = free_slot(mode)
  if slot then return assign(slot, seq, mode, push) end
  redis.call('ZADD', P .. ':q:' .. mode, seq, seq)
  bump()
  return nil
end

-- A ticket's grant (of `slot`, if given) was not taken: it waits again, in its place. A
-- ticket granted another slot since keeps that grant.
local function unassign(seq, slot)
  local t = P .. ':t:' .. seq
  local state, mode, granted = unpack(redis.call('HMGET', t, 'state', 'mode', 'slot'))
  if state == 'assigned' and (slot == nil or granted == slot) then
    redis.call('HSET', t, 'state', 'waiting')
    redis.call('HDEL', t, 'slot', 'nonce', 'addr')
    tinfo(seq)
    place(seq, mode, true)
  end
end

-- The first waiting ticket (of a live gateway) of a mode `slot` serves, as (seq, mode).
local function head_for(modes)
  local best, best_mode = nil, nil
  for m in each_mode(modes) do
    while true do
      local head = redis.call('ZRANGE', P .. ':q:' .. m, 0, 0, 'WITHSCORES')
      if #head == 0 then break end
      local gw = redis.call('HGET', P .. ':t:' .. head[1], 'gw')
      if gw and alive(':gw', gw) then
        if best == nil or tonumber(head[2]) < best[2] then best, best_mode = {head[1], tonumber(head[2])}, m end
        break
      end
      drop_ticket(head[1])
    end
  end
  if best then return best[1], best_mode end
  return nil, nil
end

-- A slot that will not serve (its node is gone, or its backend is down).
local function retire(slot, delete)
  local s = P .. ':slot:' .. slot
  local state, ticket, modes = unpack(redis.call('HMGET', s, 'state', 'ticket', 'modes'))
  unfree(slot)
  if modes then
    for m in each_mode(modes) do redis.call('SREM', P .. ':cap:' .. m, slot) end
  end
  if delete then redis.call('DEL', s) else redis.call('HSET', s, 'state', 'down') end
  if state == 'assigned' and ticket then unassign(ticket, slot) end
  bump()
end
