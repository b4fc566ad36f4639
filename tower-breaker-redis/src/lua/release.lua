-- release: the elected prober had no call to probe with and gives the
-- probe back, so that the next candidate wins at once.
--
-- KEYS[1]  the breaker's record
-- ARGV     the winner's token, cleanup (ms)
-- Reads    token, state
-- Writes   only if the record is open and holds the winner's token
--          (fencing): until = now, lease 0, token '' (the old winner's
--          renewals, close and re-open are fenced from now on); keeps
--          reopens and period (no probe failed); expiry = cleanup;
--          publishes 'o:0' (open, its period over)
-- Returns  {1} given back, {0} fenced

local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[2] ~= 'open' or rec[1] ~= ARGV[1] then return {0} end
local now = now_ms()
redis.call('HSET', KEYS[1], 'until', int(now), 'lease', '0', 'token', '')
redis.call('PEXPIRE', KEYS[1], int(tonumber(ARGV[2])))
redis.call('PUBLISH', KEYS[1], 'o:0')
return {1}
