-- claim: one retry of the fleet's retry budget.
--
-- KEYS[1]  the breaker's record
-- ARGV     epoch length (ms), floor (retries per epoch)
-- Reads    bc<epoch> (claims) and be<epoch> (credit earned, millionths)
--          of the epoch of now and of the one before
-- Writes   grants when the current epoch's claims stay within the larger
--          of the floor and its earnings (claims + 1 <= max(floor,
--          earned / 1e6)): increments its bc; else when the previous
--          epoch's earnings cover one more of its claims (no floor):
--          increments that bc. Keeps the record for two epochs at least.
-- Returns  {1} granted, {0} refused

local now = now_ms()
local window = math.max(tonumber(ARGV[1]), 1)
local floor = tonumber(ARGV[2])
local e = math.floor(now / window)
local function counts(epoch)
  local v = redis.call('HMGET', KEYS[1], 'bc' .. int(epoch), 'be' .. int(epoch))
  return tonumber(v[1] or '0') or 0, tonumber(v[2] or '0') or 0
end
local function keep()
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 2 * window then
    redis.call('PEXPIRE', KEYS[1], int(2 * window))
  end
end
local claimed, earned = counts(e)
if claimed < floor or (claimed + 1) * 1000000 <= earned then
  redis.call('HINCRBY', KEYS[1], 'bc' .. int(e), 1)
  keep()
  return {1}
end
claimed, earned = counts(e - 1)
if (claimed + 1) * 1000000 <= earned then
  redis.call('HINCRBY', KEYS[1], 'bc' .. int(e - 1), 1)
  keep()
  return {1}
end
return {0}
