"""The admission desk's Lua scripts: every change to a desk is one of these, atomically.

Each script starts with the key layout and ``ensure_desk``; the arguments every
script takes first are ``bound, new_epoch, seen_epoch, hold_ms`` (``DESK_ARGS``).
The transition script embeds ``runner.admission.table.TRANSITIONS`` as JSON.
"""

from __future__ import annotations

from runner.admission.table import HELD, table_json

DESK_ARGS = ("bound", "new_epoch", "seen_epoch", "hold_ms")

# ensure_desk(): the desk is created on first use, or after Redis lost it, with a new
# epoch, its creation time (server clock) and in_flight rebuilt from the lease
# records that still hold capacity (none after a full loss). A caller that saw another
# epoch of this desk is evidence that a desk existed before: the desk then grants
# nothing until created_ms + hold_ms, so that requests of the lost epoch still in the
# backend are not joined by new ones. Evidence arriving late (the desk was re-created
# by a caller without any) starts or extends the hold from the same created_ms.
_PRELUDE = """
-- The admission desk of one eval-run E (runner/admission/desk.py). Keys:
--   admission:{E}:desk       HASH bound, epoch, in_flight, generation, ticket,
--                                 created_ms, recovering_until_ms, counters
--   admission:{E}:leases     HASH lease id -> JSON {state, generation, step, epoch}
--   admission:{E}:committed  HASH step -> lease id of the one committed completion
--   admission:{E}:waiting    ZSET "<expiry_ms>:<lease id>", scored by arrival ticket
local HELD = HELD_SET
local function ensure_desk(desk, leases, bound, new_epoch, seen, hold_ms)
  local t = redis.call('TIME')
  local now_ms = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
  if redis.call('HSETNX', desk, 'epoch', new_epoch) == 1 then
    local held = 0
    for _, raw in ipairs(redis.call('HVALS', leases)) do
      if HELD[cjson.decode(raw).state] then held = held + 1 end
    end
    redis.call('HSET', desk, 'bound', bound, 'in_flight', held, 'generation', 0,
      'created_ms', string.format('%d', now_ms))
  end
  local epoch = redis.call('HGET', desk, 'epoch')
  if seen ~= '' and seen ~= epoch then
    local created = tonumber(redis.call('HGET', desk, 'created_ms') or '0')
    local held_until = created + tonumber(hold_ms)
    local current = tonumber(redis.call('HGET', desk, 'recovering_until_ms') or '0')
    if held_until > current then
      if current == 0 then redis.call('HINCRBY', desk, 'recoveries', 1) end
      redis.call('HSET', desk, 'recovering_until_ms', string.format('%d', held_until))
    end
  end
  return tonumber(redis.call('HGET', desk, 'bound')), epoch, now_ms
end
"""

_ACQUIRE = """
-- acquire. KEYS: desk, leases, waiting. ARGV: DESK_ARGS, lease_id, step, waiter (''
-- on the first call, else the queue entry it got), max_waiting, wait_ttl_ms (0:
-- refuse rather than queue). Capacity goes to a caller whose place in the FIFO queue
-- fits in the free capacity, of which there is none during a recovery hold; queue
-- entries past expiry belong to dead processes and are dropped. Every reply ends
-- with the desk's epoch.
local desk, leases, waiting = KEYS[1], KEYS[2], KEYS[3]
local bound = tonumber(ARGV[1])
local stored, epoch, now_ms = ensure_desk(desk, leases, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if stored ~= bound then return {'mismatch', tostring(stored), epoch} end
local lease_id, step, waiter = ARGV[5], ARGV[6], ARGV[7]
local max_waiting, wait_ttl_ms = tonumber(ARGV[8]), tonumber(ARGV[9])
for _, member in ipairs(redis.call('ZRANGE', waiting, 0, -1)) do
  local expiry = tonumber(string.match(member, '^(%d+):'))
  if expiry == nil or expiry < now_ms then redis.call('ZREM', waiting, member) end
end
local recovering = now_ms < tonumber(redis.call('HGET', desk, 'recovering_until_ms') or '0')
local free = 0
if not recovering then free = bound - tonumber(redis.call('HGET', desk, 'in_flight')) end
local rank
if waiter == '' then
  rank = redis.call('ZCARD', waiting)
else
  rank = redis.call('ZRANK', waiting, waiter)
  if not rank then
    -- Dropped past its expiry (the caller is past its deadline), or lost with
    -- Redis's data: then the caller is still within its deadline and queues again.
    local expiry = tonumber(string.match(waiter, '^(%d+):'))
    if expiry == nil or expiry < now_ms then
      redis.call('HINCRBY', desk, 'refused', 1)
      return {'refused', 'deadline', epoch}
    end
    redis.call('ZADD', waiting, redis.call('HINCRBY', desk, 'ticket', 1), waiter)
    rank = redis.call('ZRANK', waiting, waiter)
  end
end
if rank < free then
  if waiter ~= '' then redis.call('ZREM', waiting, waiter) end
  local gen = redis.call('HINCRBY', desk, 'generation', 1)
  redis.call('HINCRBY', desk, 'in_flight', 1)
  redis.call('HINCRBY', desk, 'acquired', 1)
  redis.call('HSET', leases, lease_id, cjson.encode(
    {state = 'live', generation = tostring(gen), step = step, epoch = epoch}))
  return {'granted', tostring(gen), epoch}
end
if waiter ~= '' then return {'waiting', waiter, epoch} end
if wait_ttl_ms <= 0 then
  redis.call('HINCRBY', desk, 'refused', 1)
  if recovering then return {'refused', 'recovering', epoch} end
  return {'refused', 'bound', epoch}
end
if rank >= max_waiting then
  redis.call('HINCRBY', desk, 'refused', 1)
  return {'refused', 'queue_full', epoch}
end
local member = string.format('%d', now_ms + wait_ttl_ms) .. ':' .. lease_id
redis.call('ZADD', waiting, redis.call('HINCRBY', desk, 'ticket', 1), member)
return {'waiting', member, epoch}
"""

_GIVE_UP = """
-- give_up. KEYS: desk, leases, waiting. ARGV: DESK_ARGS, waiter ('' when not queued).
-- The caller stops trying: it leaves the queue, its request counts as refused.
local _, epoch = ensure_desk(KEYS[1], KEYS[2], ARGV[1], ARGV[2], ARGV[3], ARGV[4])
if ARGV[5] ~= '' then redis.call('ZREM', KEYS[3], ARGV[5]) end
redis.call('HINCRBY', KEYS[1], 'refused', 1)
return epoch
"""

_TRANSITION = """
-- transition. KEYS: desk, leases, committed. ARGV: DESK_ARGS, ops, lease_id,
-- generation, step, lease_epoch. Applies one cell of TRANSITIONS (the Python table,
-- embedded below as JSON) to one lease for each op of ops (comma-separated, applied
-- in order, each to the state the one before left: 'apply,release' is apply, then
-- release, in one call); a commit is HSETNX, so one per step. Replies {result, state
-- the lease was in} for each op, then the desk's epoch.
local desk, leases, committed = KEYS[1], KEYS[2], KEYS[3]
local _, epoch = ensure_desk(desk, leases, ARGV[1], ARGV[2], ARGV[3], ARGV[4])
local lease_id, generation, step, lease_epoch = ARGV[6], ARGV[7], ARGV[8], ARGV[9]
local T = cjson.decode(TABLE_JSON)
local reply = {}
for op in string.gmatch(ARGV[5], '[^,]+') do
  local raw = redis.call('HGET', leases, lease_id)
  local state, rec
  if raw then
    rec = cjson.decode(raw)
    if rec.generation == generation and rec.step == step and rec.epoch == lease_epoch then
      state = rec.state
    else
      state = 'unknown'
    end
  elseif lease_epoch ~= epoch then
    state = 'foreign'
  else
    state = 'unknown'
  end
  local tr = T[state][op]
  local result = tr.result
  if result == 'commit' and redis.call('HSETNX', committed, step, lease_id) == 0 then
    result = 'duplicate'
    redis.call('HINCRBY', desk, 'duplicate_completion', 1)
  end
  if tr.to ~= '' then
    rec = rec or {generation = generation, step = step, epoch = lease_epoch}
    rec.state = tr.to
    redis.call('HSET', leases, lease_id, cjson.encode(rec))
  end
  if tr.in_flight < 0 and tonumber(redis.call('HGET', desk, 'in_flight')) <= 0 then
    redis.call('HINCRBY', desk, 'underflow_prevented', 1)
  elseif tr.in_flight ~= 0 then
    redis.call('HINCRBY', desk, 'in_flight', tr.in_flight)
  end
  if tr.bump then redis.call('HINCRBY', desk, 'generation', 1) end
  if tr.counter ~= '' then redis.call('HINCRBY', desk, tr.counter, 1) end
  reply[#reply + 1] = result
  reply[#reply + 1] = state
end
reply[#reply + 1] = epoch
return reply
"""


def _lua(body: str) -> str:
    held = "{" + ", ".join(f"{state.value} = true" for state in HELD) + "}"
    return _PRELUDE.replace("HELD_SET", held) + body.replace("DESK_ARGS", ", ".join(DESK_ARGS))


ACQUIRE_LUA = _lua(_ACQUIRE)
GIVE_UP_LUA = _lua(_GIVE_UP)
TRANSITION_LUA = _lua(_TRANSITION.replace("TABLE_JSON", f"[[{table_json()}]]"))
