-- close: the probe's winner succeeded, and closes the fleet's circuit.
--
-- KEYS[1]  the breaker's record
-- ARGV     the winner's token, cleanup (ms)
-- Reads    token, state
-- Writes   only if the record is open and holds the winner's token
--          (fencing): state 'closed', token '', since = now; deletes until,
--          lease, reopens and period, and the window (the next closed
--          period starts with an empty one); expiry = cleanup; publishes 'c'
-- Returns  {1} if it closed the circuit, {0} otherwise

local rec = redis.call('HMGET', KEYS[1], 'token', 'state')
if rec[2] == 'open' and rec[1] == ARGV[1] then
  local now = now_ms()
  clear_window(KEYS[1])
  redis.call('HSET', KEYS[1], 'state', 'closed', 'token', '', 'since', int(now))
  redis.call('HDEL', KEYS[1], 'until', 'lease', 'reopens', 'period')
  redis.call('PEXPIRE', KEYS[1], int(tonumber(ARGV[2])))
  redis.call('PUBLISH', KEYS[1], 'c')
  return {1}
end
return {0}
