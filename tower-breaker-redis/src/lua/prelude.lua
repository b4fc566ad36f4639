-- The prelude: prepended to every script of the Redis circuit store (the
-- store loads PRELUDE .. body as one script).
--
-- Defines the helpers the bodies call:
--   now_ms()        the server's clock (TIME), in milliseconds: every
--                   instant in a record is the server's, never a client's
--   int(x)          a number as an integer string, for HSET and PEXPIRE
--   clear_window(k) deletes the fleet window's fields (w0, w1, ...) of k
--   left(t, period, now)
--                   the time left until T, at most the opening's period:
--                   after a failover to a node whose clock is behind, an
--                   opening is stretched by at most that much, never by
--                   the whole difference
--   write(k, now, until, period, token, reopens, lease, cleanup)
--                   writes a whole open record and its expiry:
--                   max(until, lease) - now + cleanup milliseconds
--
-- The record (one hash per breaker, KEYS[1]): state ('open' | 'closed'),
-- until (ms, the end of the open period), token (the fencing token of the
-- election's winner), reopens, period (ms), since (ms, the last state
-- change), lease (ms, the end of the winner's probe lease), and the fleet
-- window's buckets w<slot> = '<tick>:<calls>:<failures>:<slow>', or its
-- count window's parts wg<seq> = '<at>:<calls>:<failures>:<slow>' and
-- their sequence wseq (every window field starts with 'w').
--
-- Scripts replicate their effects, not themselves (they read TIME).

if redis.replicate_commands then redis.replicate_commands() end
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end
local function int(x) return string.format('%.0f', x) end
local function clear_window(key)
  for _, field in ipairs(redis.call('HKEYS', key)) do
    if string.sub(field, 1, 1) == 'w' then redis.call('HDEL', key, field) end
  end
end
local function left(t, period, now)
  local l = t - now
  if period and period > 0 and l > period then l = period end
  return l
end
-- {4, time left until T (0 once passed), time left of the lease} while
-- an elected prober's lease runs; nil without one.
local function probing(t, period, lease, now)
  lease = tonumber(lease) or 0
  if lease <= now then return nil end
  local l = 0
  if t and t > now then l = left(t, period, now) end
  return {4, l, lease - now}
end
local function write(key, now, until_ms, period, token, reopens, lease, cleanup)
  redis.call('HSET', key, 'state', 'open', 'until', int(until_ms), 'token', token,
    'reopens', int(reopens), 'period', int(period), 'since', int(now), 'lease', int(lease))
  redis.call('PEXPIRE', key, int(math.max(until_ms, lease) - now + cleanup))
end
