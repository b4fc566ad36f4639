-- elect: once the open period is over, one process of the fleet wins the
-- probe and a lease for it; the others keep rejecting.
--
-- KEYS[1]  the breaker's record
-- ARGV     period (ms), the candidate's token, lease (ms), cleanup (ms)
-- Reads    until, reopens, period, state, lease
-- Writes   unless the record is closed, once the open period and any
--          earlier lease are over (a missing record included): an open
--          record with the candidate's token, a new open period
--          (max(period, the record's)) and lease = now + lease; clears
--          the window, as an opening does (evidence from before the
--          election is not evidence after the probe)
-- Returns  {0} closed, {1, remaining} lost (the open period still runs),
--          {2, reopens, period} won, {4, remaining, lease} lost to the
--          elected prober whose lease still runs (remaining: until T, 0
--          once passed)

local now = now_ms()
local rec = redis.call('HMGET', KEYS[1], 'until', 'reopens', 'period', 'state', 'lease')
if rec[4] == 'closed' then return {0} end
local t = tonumber(rec[1])
local p = probing(t, tonumber(rec[3]), rec[5], now)
if p then return p end
if t and t > now then return {1, left(t, tonumber(rec[3]), now)} end
local reopens = tonumber(rec[2]) or 0
local period = math.max(tonumber(ARGV[1]), tonumber(rec[3]) or 0)
clear_window(KEYS[1])
write(KEYS[1], now, now + period, period, ARGV[2], reopens, now + tonumber(ARGV[3]),
  tonumber(ARGV[4]))
return {2, reopens, period}
