-- report: a process adds its calls to the fleet's window, and opens the
-- circuit if the window breaks the rule.
--
-- KEYS[1]  the breaker's record
-- ARGV     calls, failures, slow, bucket (ms), buckets, minimum calls,
--          failure rate (ppm), slow rate (ppm, 0: off), period (ms),
--          token, cleanup (ms), count window (calls, 0: buckets), tail
--          (failures in a row at the report's end), tail span (ms)
-- Reads    until, state, reopens, period, the window's buckets, or its
--          parts (count window)
-- Writes   while open: nothing. Buckets: adds the counts to the bucket of
--          the current tick (w<tick % buckets>, reset if it held an older
--          tick). Count window: adds the report as at most two parts
--          wg<seq> = '<at>:<calls>:<failures>:<slow>' (seq from wseq):
--          the tail at now, the rest at now - tail span; then judges the
--          newest `count window` calls of the parts placed within
--          buckets * bucket of now (the oldest part counted in
--          proportion) and deletes the parts that no longer count.
--          Either way: if the window holds at least `minimum` calls and
--          the failure (or slow) rate reaches its threshold: clears the
--          window, writes an open record and publishes 'o:<period>'; else
--          extends the expiry to keep the window (buckets * bucket +
--          cleanup)
--          Retry budget (ARGV 15-17: credit in millionths of a retry,
--          retries returned, epoch length in ms, 0: no budget), first,
--          open or not: adds the credit to be<epoch>, takes the returned
--          retries off bc<epoch> (the epoch of now), and deletes the
--          fields of the epochs two and three before
-- Returns  what read returns: {0} closed, {1, remaining} open (just now,
--          or already), {2} expired, {3} missing, {4, remaining, lease}
--          open while an elected prober's lease runs

local now = now_ms()
local budget_ms = tonumber(ARGV[17]) or 0
if budget_ms > 0 then
  local e = math.floor(now / budget_ms)
  local credit = tonumber(ARGV[15]) or 0
  local returned = tonumber(ARGV[16]) or 0
  if credit > 0 then redis.call('HINCRBY', KEYS[1], 'be' .. int(e), int(credit)) end
  if returned > 0 then
    local claimed = tonumber(redis.call('HGET', KEYS[1], 'bc' .. int(e)) or '0')
    redis.call('HSET', KEYS[1], 'bc' .. int(e), int(math.max(claimed - returned, 0)))
  end
  redis.call('HDEL', KEYS[1], 'be' .. int(e - 2), 'bc' .. int(e - 2), 'be' .. int(e - 3), 'bc' .. int(e - 3))
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 2 * budget_ms then redis.call('PEXPIRE', KEYS[1], int(2 * budget_ms)) end
end
local rec = redis.call('HMGET', KEYS[1], 'until', 'state', 'reopens', 'period', 'lease')
if rec[2] == 'open' then
  local t = tonumber(rec[1])
  local p = probing(t, tonumber(rec[4]), rec[5], now)
  if p then return p end
  if t and t > now then return {1, left(t, tonumber(rec[4]), now)} end
  return {2}
end
local bucket_ms = tonumber(ARGV[4])
local buckets = tonumber(ARGV[5])
local calls, failures, slow = 0, 0, 0
local window = tonumber(ARGV[12]) or 0
if window > 0 then
  local c, f, s = tonumber(ARGV[1]), tonumber(ARGV[2]), tonumber(ARGV[3])
  local tail = math.min(tonumber(ARGV[13]) or 0, f, c)
  local parts = {}
  local all = redis.call('HGETALL', KEYS[1])
  for i = 1, #all, 2 do
    if string.sub(all[i], 1, 2) == 'wg' then
      local at, cc, ff, ss = string.match(all[i + 1], '^(%d+):(%d+):(%d+):(%d+)$')
      if at then
        table.insert(parts, {all[i], tonumber(at), tonumber(cc), tonumber(ff), tonumber(ss)})
      end
    end
  end
  local rest_at = math.max(now - (tonumber(ARGV[14]) or 0), 0)
  local new_parts = {{rest_at, c - tail, f - tail, math.min(s, c - tail)}, {now, tail, tail, 0}}
  for _, p in ipairs(new_parts) do
    if p[2] > 0 then
      local field = 'wg' .. int(redis.call('HINCRBY', KEYS[1], 'wseq', 1))
      redis.call('HSET', KEYS[1], field, int(p[1]) .. ':' .. int(p[2]) .. ':' .. int(p[3]) .. ':' .. int(p[4]))
      table.insert(parts, {field, p[1], p[2], p[3], p[4]})
    end
  end
  -- Newest first; at the same instant, failures first (as the breaker's
  -- own judge does).
  -- (An insertion sort: a few dozen parts, and stable.)
  for i = 2, #parts do
    local p = parts[i]
    local j = i - 1
    while j >= 1 and (parts[j][2] < p[2] or (parts[j][2] == p[2] and parts[j][4] < p[4])) do
      parts[j + 1] = parts[j]
      j = j - 1
    end
    parts[j + 1] = p
  end
  local oldest = now - bucket_ms * buckets
  for _, p in ipairs(parts) do
    if calls >= window or p[2] < oldest then
      redis.call('HDEL', KEYS[1], p[1])
    else
      local take = math.min(p[3], window - calls)
      if take == p[3] then
        failures = failures + p[4]
        slow = slow + p[5]
      else
        failures = failures + math.floor(p[4] * take / p[3])
        slow = slow + math.floor(p[5] * take / p[3])
      end
      calls = calls + take
    end
  end
else
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
