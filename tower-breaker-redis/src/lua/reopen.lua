-- reopen: the probe's winner failed, and opens the circuit again (its open
-- period grown by the caller).
--
-- KEYS[1]  the breaker's record
-- ARGV     period (ms), the winner's token, a fresh token, cleanup (ms)
-- Reads    until, token, reopens, state, period
-- Writes   only if the record is open and holds the winner's token
--          (fencing: a winner whose lease lapsed writes nothing): an open
--          record until max(now + period, until) with the fresh token,
--          period = until - now (its effective length), reopens + 1,
--          lease 0; publishes 'o:<remaining>'
-- Returns  {1, remaining} if it wrote, {0, remaining} if another holds the
--          record while it is open, {0, 0} otherwise

local now = now_ms()
local period = tonumber(ARGV[1])
local rec = redis.call('HMGET', KEYS[1], 'until', 'token', 'reopens', 'state', 'period')
local open = rec[4] == 'open'
local t = tonumber(rec[1])
if open and rec[2] == ARGV[2] then
  local until_ms = now + period
  if t and t > until_ms then until_ms = t end
  -- The opening's period is its effective length (never less than the
  -- caller's): what a read caps the time left at.
  write(KEYS[1], now, until_ms, until_ms - now, ARGV[3], (tonumber(rec[3]) or 0) + 1, 0,
    tonumber(ARGV[4]))
  redis.call('PUBLISH', KEYS[1], 'o:' .. int(until_ms - now))
  return {1, until_ms - now}
end
if open and t and t > now then return {0, left(t, tonumber(rec[5]), now)} end
return {0, 0}
