-- Node ARGV[1], reached at ARGV[2], is alive for ARGV[3] ms more; a grant not taken within
-- ARGV[4] ms is stale. Then, per worker, (slot, state, modes, tag): state 'busy' (the session
-- of ticket tag holds it), 'down' (its backend is not open), 'offered' (free, offered under
-- nonce tag) or 'pending' (free, its offer under way). The node's word is the truth; the
-- store follows it.
-- Returns {known, slots to offer again (under a new nonce)}.
local node, addr, lease, deadline = ARGV[1], ARGV[2], tonumber(ARGV[3]), tonumber(ARGV[4])
local known = alive(':node', node) and 1 or 0
redis.call('ZADD', P .. ':node', NOW + lease, node)
redis.call('HSET', P .. ':nodeinfo:' .. node, 'addr', addr)
local again = {}
for i = 5, #ARGV, 4 do
  local slot, state, modes, tag = ARGV[i], ARGV[i + 1], ARGV[i + 2], ARGV[i + 3]
  local s = P .. ':slot:' .. slot
  redis.call('SADD', P .. ':slots:' .. node, slot)
  local have, ticket, since, have_nonce =
    unpack(redis.call('HMGET', s, 'state', 'ticket', 'since', 'nonce'))
  if state == 'busy' then
    if have ~= 'busy' then
      redis.call('HSET', s, 'node', node, 'addr', addr, 'modes', modes, 'state', 'busy', 'since', NOW)
      unfree(slot)
      for m in each_mode(modes) do redis.call('SADD', P .. ':cap:' .. m, slot) end
      -- A grant to another ticket cannot have been taken: that ticket waits again. The
      -- session's own ticket leaves the queue as its claim would make it.
      if have == 'assigned' and ticket and ticket ~= tag then unassign(ticket, slot) end
      if ticket == tag then drop_ticket(tag) end
      bump()
    end
  elseif state == 'down' then
    if have ~= 'down' then
      redis.call('HSET', s, 'node', node, 'addr', addr, 'modes', modes)
      retire(slot, false)
    end
  elseif state == 'offered' then
    if have_nonce ~= tag or have == 'busy' or have == 'down' or not have then
      table.insert(again, slot)
    elseif have == 'assigned' and
        (redis.call('EXISTS', P .. ':t:' .. ticket) == 0 or NOW - tonumber(since) > deadline) then
      table.insert(again, slot)
    end
  end
end
return {known, again}
