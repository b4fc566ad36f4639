-- renew: the elected prober is alive and its probe still runs: its lease
-- goes on (a heartbeat, every third of the lease).
--
-- KEYS[1]  the breaker's record
-- ARGV     lease (ms), the winner's token, cleanup (ms)
-- Reads    token, state, until, lease
-- Writes   only if the record is open and holds the winner's token
--          (fencing: a prober whose lease lapsed and was taken over writes
--          nothing): lease = max(lease, now + lease), and the expiry
--          max(until, lease) - now + cleanup
-- Returns  {1} renewed, {0} fenced

local rec = redis.call('HMGET', KEYS[1], 'token', 'state', 'until', 'lease')
if rec[2] ~= 'open' or rec[1] ~= ARGV[2] then return {0} end
local now = now_ms()
local lease = math.max(tonumber(rec[4]) or 0, now + tonumber(ARGV[1]))
local t = tonumber(rec[3]) or now
redis.call('HSET', KEYS[1], 'lease', int(lease))
redis.call('PEXPIRE', KEYS[1], int(math.max(t, lease) - now + tonumber(ARGV[3])))
return {1}
