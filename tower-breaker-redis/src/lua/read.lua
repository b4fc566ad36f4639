-- read: what a process learns of the fleet's circuit when it refreshes.
--
-- KEYS[1]  the breaker's record
-- Reads    until, state, period (the time left is at most the period), lease
-- Writes   nothing
-- Returns  {0} closed, {1, remaining} open, {2} expired (open, its period
--          over: an election is due), {3} missing, {4, remaining, lease}
--          open while an elected prober's lease runs (remaining 0 once T
--          has passed); an error reply if until is not a number

local now = now_ms()
local rec = redis.call('HMGET', KEYS[1], 'until', 'state', 'period', 'lease')
if rec[2] == 'closed' then return {0} end
if not rec[1] and not rec[2] then return {3} end
local t = tonumber(rec[1])
if not t then return redis.error_reply('tower-breaker: unreadable record (until is not a number)') end
local p = probing(t, tonumber(rec[3]), rec[4], now)
if p then return p end
if t > now then return {1, left(t, tonumber(rec[3]), now)} end
return {2}
