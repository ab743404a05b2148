"""The Lua scripts of the Redis occupancy keeper (:mod:`turnout.gateway.redis_occupancy`).

Each runs atomically in Redis, on Redis's clock (``TIME``, milliseconds), so every replica's requests are counted in
one sequence and a dead replica's leases expire by one clock. They follow :mod:`turnout.core.admission` (caps, the
queue's order, fair tags) and :func:`turnout.core.prefix.match_of` (what the index reports); the keeper's tests run
the same tables against them and against :class:`turnout.gateway.occupancy.LocalOccupancy`.

Keys under a prefix ``P`` (``storage.redis_prefix``):

- ``P:l:all``, ``P:l:m:<model>``, ``P:l:t:<tenant>``, ``P:l:w:<worker>``, ``P:l:b:<worker>`` and ``P:l:mb:<model>``
  (batch): sorted sets of
  leases (member: the lease id, score: when it expires); a replica renews its own every few seconds;
- ``P:q:<model>`` (score: :func:`turnout.core.admission.queue_score`), ``P:qt:<model>`` (ticket -> tenant),
  ``P:qv:<model>`` (``_v<rank>``: a class's virtual time; ``t:<rank>:<tenant>``: its last tag in that class),
  ``P:qx`` (every ticket's expiry), ``P:tcap`` (tenant -> cap);
- the prefix index of each worker: ``P:px:<worker>`` (block key -> the send that last carried it, its first block
  highest), ``P:ps:<worker>`` (``<send>|<bytes>`` -> when it was sent), ``P:pn:<worker>`` (the last send),
  ``P:pss:<worker>`` (session -> send) and ``P:psz:<worker>`` (session -> bytes);
- ``P:lw:<worker>``: each lease on the worker -> ``<work_ms>|<start_ms>``: the work its replica expected of it when
  it ranked the worker (``-1``: not ranked, a single candidate) and when it was taken, so that every replica prices
  the worker's queue as the one that sent each request did (a lease gone without its give leaves an entry that no
  live lease reads; pruned as they pile up);
- ``P:ls:<worker>``: the batch requests on the worker that their replica offers to stop (lease -> ``<replica>|<model>``;
  removed by its give or by the stop that claims it; one whose lease expired is pruned by the next view that reads
  it); a stop is published on ``P:stop`` (the lease), which every replica hears and the one holding it acts on;
- ``P:reps``: the live replicas (member: its id, score: until when).

Numbers that may be fractional travel as strings (Redis turns a Lua number reply into an integer).
"""

from __future__ import annotations

__all__ = ["BACKLOG_MAX", "GIVE", "GIVE_KEYS", "JOIN", "STOP", "TAKE", "TAKE_FIELDS", "VIEW"]

BACKLOG_MAX = 256  # a worker's leases whose expected work a view adds up (the rest count as unranked)

_COMMON = """
local P = ARGV[1]
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function live(key, now)
  redis.call('ZREMRANGEBYSCORE', key, '-inf', now)
  return redis.call('ZCARD', key)
end
local function head(model, now)
  local q, qt, qx = P .. ':q:' .. model, P .. ':qt:' .. model, P .. ':qx'
  for _, ticket in ipairs(redis.call('ZRANGE', q, 0, 63)) do
    local expires = redis.call('ZSCORE', qx, ticket)
    if (not expires) or tonumber(expires) < now then
      redis.call('ZREM', q, ticket)
      redis.call('ZREM', qx, ticket)
      redis.call('HDEL', qt, ticket)
    else
      local tenant = redis.call('HGET', qt, ticket) or ''
      local cap = redis.call('HGET', P .. ':tcap', tenant)
      if (not cap) or live(P .. ':l:t:' .. tenant, now) < tonumber(cap) then
        return ticket
      end
    end
  end
  return false
end
"""

# ARGV: P, model, tenant, ticket ('' none), ttl_ms, n, then n x (worker, slots or -1), packed keys, session ('' none),
# whether to list the batch requests offered to stop ('1' or '0').
# Then: Redis's time (ms), the leases of all, of the model, of the tenant, whether a waiter is ahead, the model's
# batch leases; per worker: its leases, the work expected of the ranked ones (ms) and how many, when the oldest was
# taken (ms, -1: none known), then with a prompt what its index holds of it (:func:`turnout.core.prefix.match_of`'s
# arguments); last, when asked, the live batch requests of the model offered to stop on these workers, flat: worker,
# lease, replica, ``<work_ms>|<start_ms>``.
VIEW = (
    _COMMON
    + """
local BACKLOG_MAX = """
    + str(BACKLOG_MAX)
    + """
local model, tenant, ticket, ttl, n = ARGV[2], ARGV[3], ARGV[4], tonumber(ARGV[5]), tonumber(ARGV[6])
local packed, session, offered = ARGV[7 + 2 * n], ARGV[8 + 2 * n], ARGV[9 + 2 * n]
local now = now_ms()
local first = head(model, now)
local ahead = 0
if first and first ~= ticket then ahead = 1 end
local out = {now, live(P .. ':l:all', now), live(P .. ':l:m:' .. model, now), live(P .. ':l:t:' .. tenant, now), ahead,
             live(P .. ':l:mb:' .. model, now)}
local count = #packed / 8
for i = 0, n - 1 do
  local worker, slots = ARGV[7 + 2 * i], tonumber(ARGV[8 + 2 * i])
  local lw = P .. ':l:w:' .. worker
  local entry = {live(lw, now), 0, 0, -1}
  if entry[1] > 0 then
    local leases = redis.call('ZRANGE', lw, 0, BACKLOG_MAX - 1)
    local works = redis.call('HMGET', P .. ':lw:' .. worker, unpack(leases))
    for k = 1, #leases do
      if works[k] then
        local bar = string.find(works[k], '|', 1, true)
        local work, start = tonumber(string.sub(works[k], 1, bar - 1)), tonumber(string.sub(works[k], bar + 1))
        if work >= 0 then entry[2] = entry[2] + work; entry[3] = entry[3] + 1 end
        if entry[4] < 0 or start < entry[4] then entry[4] = start end
      end
    end
  end
  if count > 0 or session ~= '' then
    local ps = P .. ':ps:' .. worker
    redis.call('ZREMRANGEBYSCORE', ps, '-inf', now - ttl)
    local latest = tonumber(redis.call('GET', P .. ':pn:' .. worker) or '0')
    local oldest = redis.call('ZRANGE', ps, 0, 0)
    local recent = latest + 1
    if oldest[1] then recent = tonumber(string.sub(oldest[1], 1, 12)) end
    local evicted_at, evicted_size = -1, -1
    if slots >= 1 and redis.call('ZCARD', ps) >= slots then
      local pick = redis.call('ZRANGE', ps, -slots, -slots, 'WITHSCORES')
      evicted_at, evicted_size = tonumber(pick[2]), tonumber(string.sub(pick[1], 14))
    end
    local session_send, session_size = -1, -1
    if session ~= '' then
      local s = redis.call('ZSCORE', P .. ':pss:' .. worker, session)
      if s then
        session_send = tonumber(s)
        session_size = tonumber(redis.call('HGET', P .. ':psz:' .. worker, session) or '0')
      end
    end
    local sends = {}
    if count > 0 then
      local members = {}
      for k = 0, count - 1 do members[k + 1] = string.sub(packed, k * 8 + 1, k * 8 + 8) end
      local scores = redis.call('ZMSCORE', P .. ':px:' .. worker, unpack(members))
      for k = 1, count do
        if not scores[k] then break end
        local send = math.floor(tonumber(scores[k]))
        if send < recent then break end
        sends[k] = send
      end
    end
    entry = {entry[1], entry[2], entry[3], entry[4], latest, recent, evicted_at, evicted_size, session_send,
             session_size, sends}
  end
  out[7 + i] = entry
end
if offered == '1' then
  local lines = {}
  for i = 0, n - 1 do
    local worker = ARGV[7 + 2 * i]
    local ls = P .. ':ls:' .. worker
    local pairs_ = redis.call('HGETALL', ls)
    for k = 1, #pairs_, 2 do
      local lease, value = pairs_[k], pairs_[k + 1]
      local expires = redis.call('ZSCORE', P .. ':l:w:' .. worker, lease)
      if (not expires) or tonumber(expires) < now then
        redis.call('HDEL', ls, lease)
      else
        local bar = string.find(value, '|', 1, true)
        if string.sub(value, bar + 1) == model then
          lines[#lines + 1] = worker
          lines[#lines + 1] = lease
          lines[#lines + 1] = string.sub(value, 1, bar - 1)
          lines[#lines + 1] = redis.call('HGET', P .. ':lw:' .. worker, lease) or '-1|-1'
        end
      end
    end
  end
  out[7 + n] = lines
end
return out
"""
)

# ARGV: P, lease_ms, band, max_blocks, max_sessions, ttl_ms, then per grant TAKE_FIELDS fields: lease, model, tenant,
#       worker, batch (0/1), caps x6 (-1: none), ticket ('' none), packed keys ('' none), bytes, session ('' none),
#       expected work (ms, -1: not ranked), the worker's leases its router saw (-1: nothing to check). The grants are
#       taken in order, each against what the ones before it took; one answer each ('ok', 'moved': the worker has
#       more leases than its router saw, :func:`turnout.core.admission.moved`; the count at its cap, or 'ahead'), then
#       the number of live replicas (each one's share of a cap, Redis away), then Redis's time (ms: when the ones
#       taken started).
TAKE_FIELDS = 17
TAKE = (
    _COMMON
    + """
local lease_ms, band = tonumber(ARGV[2]), tonumber(ARGV[3])
local max_blocks, max_sessions, ttl = tonumber(ARGV[4]), tonumber(ARGV[5]), tonumber(ARGV[6])
local now = now_ms()
local names = {'total', 'model', 'tenant', 'worker', 'worker_batch', 'model_batch'}

local function record(worker, packed, size, session)
  local send = redis.call('INCR', P .. ':pn:' .. worker)
  local px, ps = P .. ':px:' .. worker, P .. ':ps:' .. worker
  local count = #packed / 8
  local args = {}
  for k = 0, count - 1 do
    args[#args + 1] = send + (count - k) / (2 * count + 2)
    args[#args + 1] = string.sub(packed, k * 8 + 1, k * 8 + 8)
    if #args >= 400 then redis.call('ZADD', px, unpack(args)); args = {} end
  end
  if #args > 0 then redis.call('ZADD', px, unpack(args)) end
  local over = redis.call('ZCARD', px) - max_blocks
  if over > 0 then redis.call('ZPOPMIN', px, over) end
  redis.call('ZADD', ps, now, string.format('%012d|%s', send, size))
  redis.call('ZREMRANGEBYSCORE', ps, '-inf', now - ttl)
  over = redis.call('ZCARD', ps) - max_blocks
  if over > 0 then redis.call('ZPOPMIN', ps, over) end
  if session ~= '' then
    local pss, psz = P .. ':pss:' .. worker, P .. ':psz:' .. worker
    redis.call('ZADD', pss, send, session)
    redis.call('HSET', psz, session, size)
    over = redis.call('ZCARD', pss) - max_sessions
    if over > 0 then
      local gone = redis.call('ZPOPMIN', pss, over)
      for k = 1, #gone, 2 do redis.call('HDEL', psz, gone[k]) end
    end
  end
end

local function served(model, ticket)
  local q = P .. ':q:' .. model
  local score = redis.call('ZSCORE', q, ticket)
  if score then
    score = tonumber(score)
    local rank = math.floor(score / band)
    local tag = score - rank * band
    local qv = P .. ':qv:' .. model
    local v = tonumber(redis.call('HGET', qv, '_v' .. rank) or '0')
    if tag > v then redis.call('HSET', qv, '_v' .. rank, tostring(tag)) end
  end
  redis.call('ZREM', q, ticket)
  redis.call('ZREM', P .. ':qx', ticket)
  redis.call('HDEL', P .. ':qt:' .. model, ticket)
end

local function take(a)
  local lease, model, tenant, worker = ARGV[a], ARGV[a + 1], ARGV[a + 2], ARGV[a + 3]
  local batch = ARGV[a + 4] == '1'
  local ticket, packed, size, session = ARGV[a + 11], ARGV[a + 12], ARGV[a + 13], ARGV[a + 14]
  local work, seen = ARGV[a + 15], tonumber(ARGV[a + 16])
  local keys = {P .. ':l:all', P .. ':l:m:' .. model, P .. ':l:t:' .. tenant,
                P .. ':l:w:' .. worker, P .. ':l:b:' .. worker, P .. ':l:mb:' .. model}
  if seen >= 0 and live(keys[4], now) > seen then return 'moved' end
  for i = 1, 6 do
    local cap = tonumber(ARGV[a + 4 + i])
    if cap >= 0 and (i < 5 or batch) and live(keys[i], now) >= cap then return names[i] end
  end
  local first = head(model, now)
  if first and first ~= ticket then return 'ahead' end
  local expires = now + lease_ms
  for i = 1, 4 do redis.call('ZADD', keys[i], expires, lease) end
  if batch then
    redis.call('ZADD', keys[5], expires, lease)
    redis.call('ZADD', keys[6], expires, lease)
  end
  local lw = P .. ':lw:' .. worker
  redis.call('HSET', lw, lease, work .. '|' .. now)
  if redis.call('HLEN', lw) > 2 * redis.call('ZCARD', keys[4]) + 64 then
    for _, gone in ipairs(redis.call('HKEYS', lw)) do
      if not redis.call('ZSCORE', keys[4], gone) then redis.call('HDEL', lw, gone) end
    end
  end
  if ticket ~= '' then served(model, ticket) end
  if packed ~= '' or session ~= '' then record(worker, packed, size, session) end
  return 'ok'
end

local out = {}
for a = 7, #ARGV, """
    + str(TAKE_FIELDS)
    + """ do out[#out + 1] = take(a) end
out[#out + 1] = redis.call('ZCOUNT', P .. ':reps', '(' .. now, '+inf')
out[#out + 1] = now
return out
"""
)


# ARGV: P, model, tenant, weight, rank, ticket, max_queue, expires_ms, band -> the ticket's tag, or false: the queue
# is full
JOIN = (
    _COMMON
    + """
local model, tenant, weight, rank = ARGV[2], ARGV[3], tonumber(ARGV[4]), tonumber(ARGV[5])
local ticket, max_queue, expires_ms, band = ARGV[6], tonumber(ARGV[7]), tonumber(ARGV[8]), tonumber(ARGV[9])
local now = now_ms()
local qx = P .. ':qx'
if live(qx, now) >= max_queue then return false end
local qv = P .. ':qv:' .. model
local v = tonumber(redis.call('HGET', qv, '_v' .. rank) or '0')
local last = tonumber(redis.call('HGET', qv, 't:' .. rank .. ':' .. tenant) or '0')
local tag = math.max(last, v) + 1 / math.max(weight, 1)
redis.call('HSET', qv, 't:' .. rank .. ':' .. tenant, tostring(tag))
redis.call('ZADD', P .. ':q:' .. model, rank * band + tag, ticket)
redis.call('ZADD', qx, now + expires_ms, ticket)
redis.call('HSET', P .. ':qt:' .. model, ticket, tenant)
return tostring(tag)
"""
)


# ARGV: P, then per lease: its id, model, tenant, worker, batch (0/1). Removes each lease from its sets and, when any
# request waits anywhere (a live ticket), publishes each model once: the first waiters route again.
GIVE = (
    _COMMON
    + """
local n = (#ARGV - 1) / 5
local models = {}
for i = 0, n - 1 do
  local lease, model, tenant, worker, batch = ARGV[2 + 5 * i], ARGV[3 + 5 * i], ARGV[4 + 5 * i], ARGV[5 + 5 * i],
    ARGV[6 + 5 * i]
  redis.call('ZREM', P .. ':l:all', lease)
  redis.call('ZREM', P .. ':l:m:' .. model, lease)
  redis.call('ZREM', P .. ':l:t:' .. tenant, lease)
  redis.call('ZREM', P .. ':l:w:' .. worker, lease)
  redis.call('HDEL', P .. ':lw:' .. worker, lease)
  if batch == '1' then
    redis.call('HDEL', P .. ':ls:' .. worker, lease)
    redis.call('ZREM', P .. ':l:b:' .. worker, lease)
    redis.call('ZREM', P .. ':l:mb:' .. model, lease)
  end
  models[model] = true
end
if live(P .. ':qx', now_ms()) > 0 then
  for model, _ in pairs(models) do redis.call('PUBLISH', P .. ':freed', model) end
end
return n
"""
)


def GIVE_KEYS(prefix: str, model: str, tenant: str, worker: str, batch: bool) -> list[str]:
    """The lease sets a lease is in (its give removes it from each)."""
    keys = [f"{prefix}:l:all", f"{prefix}:l:m:{model}", f"{prefix}:l:t:{tenant}", f"{prefix}:l:w:{worker}"]
    return [*keys, f"{prefix}:l:b:{worker}", f"{prefix}:l:mb:{model}"] if batch else keys


# ARGV: P, worker, lease -> 1: the lease was offered to stop and this call claimed it (its replica is told on
# ``P:stop``), 0: it was not (given back, or another request's stop came first).
STOP = """
local P, worker, lease = ARGV[1], ARGV[2], ARGV[3]
if redis.call('HDEL', P .. ':ls:' .. worker, lease) == 1 then
  redis.call('PUBLISH', P .. ':stop', lease)
  return 1
end
return 0
"""
