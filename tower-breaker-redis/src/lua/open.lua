-- open: the breaker that tripped opens the fleet's circuit.
--
-- KEYS[1]  the breaker's record
-- ARGV     period (ms), token, cleanup (ms)
-- Reads    until, reopens, state, period
-- Writes   if the record is not open with time left: clears the window,
--          writes an open record (until = now + period, lease 0, reopens
--          kept unless the record was closed), sets its expiry, publishes
--          'o:<period>' on the record's key
-- Returns  {1, period} if it wrote, {0, remaining} if already open

local now = now_ms()
local period = tonumber(ARGV[1])
local rec = redis.call('HMGET', KEYS[1], 'until', 'reopens', 'state', 'period')
local closed = rec[3] == 'closed'
local t = tonumber(rec[1])
if not closed and t and t > now then return {0, left(t, tonumber(rec[4]), now)} end
local reopens = 0
if not closed then reopens = tonumber(rec[2]) or 0 end
clear_window(KEYS[1])
write(KEYS[1], now, now + period, period, ARGV[2], reopens, 0, tonumber(ARGV[3]))
redis.call('PUBLISH', KEYS[1], 'o:' .. int(period))
return {1, period}
