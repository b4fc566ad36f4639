-- report: a process adds its calls to the fleet's window, and opens the
-- circuit if the window breaks the rule.
--
-- KEYS[1]  the breaker's record
-- ARGV     calls, failures, slow, bucket (ms), buckets, minimum calls,
--          failure rate (ppm), slow rate (ppm, 0: off), period (ms),
--          token, cleanup (ms)
-- Reads    until, state, reopens, period, the window's buckets
-- Writes   while open: nothing. Otherwise adds the counts to the bucket of
--          the current tick (w<tick % buckets>, reset if it held an older
--          tick); if the buckets of the last `buckets` ticks hold at least
--          `minimum` calls and the failure (or slow) rate reaches its
--          threshold: clears the window, writes an open record and
--          publishes 'o:<period>'; else extends the expiry to keep the
--          window (buckets * bucket + cleanup)
-- Returns  what read returns: {0} closed, {1, remaining} open (just now,
--          or already), {2} expired, {3} missing

local now = now_ms()
local rec = redis.call('HMGET', KEYS[1], 'until', 'state', 'reopens', 'period')
if rec[2] == 'open' then
  local t = tonumber(rec[1])
  if t and t > now then return {1, left(t, tonumber(rec[4]), now)} end
  return {2}
end
local bucket_ms = tonumber(ARGV[4])
local buckets = tonumber(ARGV[5])
local tick = math.floor(now / bucket_ms)
local field = 'w' .. int(tick % buckets)
local c, f, s = 0, 0, 0
local cur = redis.call('HGET', KEYS[1], field)
if cur then
  local i, cc, ff, ss = string.match(cur, '^(%d+):(%d+):(%d+):(%d+)$')
  if tonumber(i) == tick then c, f, s = tonumber(cc), tonumber(ff), tonumber(ss) end
end
c = c + tonumber(ARGV[1])
f = f + tonumber(ARGV[2])
s = s + tonumber(ARGV[3])
redis.call('HSET', KEYS[1], field, int(tick) .. ':' .. int(c) .. ':' .. int(f) .. ':' .. int(s))
local calls, failures, slow = 0, 0, 0
for slot = 0, buckets - 1 do
  local v = redis.call('HGET', KEYS[1], 'w' .. int(slot))
  if v then
    local i, cc, ff, ss = string.match(v, '^(%d+):(%d+):(%d+):(%d+)$')
    i = tonumber(i)
    if i and i <= tick and i > tick - buckets then
      calls = calls + tonumber(cc)
      failures = failures + tonumber(ff)
      slow = slow + tonumber(ss)
    end
  end
end
local minimum = tonumber(ARGV[6])
local fppm = tonumber(ARGV[7])
local sppm = tonumber(ARGV[8])
if calls > 0 and calls >= minimum and
   (failures * 1000000 >= fppm * calls or (sppm > 0 and slow * 1000000 >= sppm * calls)) then
  local period = tonumber(ARGV[9])
  local reopens = 0
  if rec[2] ~= 'closed' then reopens = tonumber(rec[3]) or 0 end
  clear_window(KEYS[1])
  write(KEYS[1], now, now + period, period, ARGV[10], reopens, 0, tonumber(ARGV[11]))
  redis.call('PUBLISH', KEYS[1], 'o:' .. int(period))
  return {1, period}
end
local ttl = redis.call('PTTL', KEYS[1])
local keep = buckets * bucket_ms + tonumber(ARGV[11])
if ttl < keep then redis.call('PEXPIRE', KEYS[1], int(keep)) end
if rec[2] == 'closed' then return {0} end
return {3}
