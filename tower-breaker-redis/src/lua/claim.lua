-- claim: one retry of the fleet's retry budget.
--
-- KEYS[1]  the breaker's record
-- ARGV     epoch length (ms), floor (retries per window)
-- Reads    bc<epoch> (claims) and be<epoch> (credit earned, millionths)
--          of the epoch of now and of the one before
-- Writes   grants when the sliding window's claims (the current epoch's,
--          plus the previous one's weighted by the share of it the window
--          still covers) plus one stay within the larger of the floor and
--          the window's credit (weighted alike): increments bc<epoch>.
--          Keeps the record for two epochs at least. (The same rule as
--          tower_breaker::store::BudgetRule::grants, in millionths.)
-- Returns  {1} granted, {0} refused

local now = now_ms()
local window = math.max(tonumber(ARGV[1]), 1)
local floor = tonumber(ARGV[2])
local e = math.floor(now / window)
local function counts(epoch)
  local v = redis.call('HMGET', KEYS[1], 'bc' .. int(epoch), 'be' .. int(epoch))
  return tonumber(v[1] or '0') or 0, tonumber(v[2] or '0') or 0
end
local claimed, earned = counts(e)
local claimed_before, earned_before = counts(e - 1)
local weight = 1000000 - math.floor((now % window) * 1000000 / window)
local claims = claimed * 1000000 + claimed_before * weight
local credit = earned + math.floor(earned_before * weight / 1000000)
if claims + 1000000 <= math.max(floor * 1000000, credit) then
  redis.call('HINCRBY', KEYS[1], 'bc' .. int(e), 1)
  local ttl = redis.call('PTTL', KEYS[1])
  if ttl < 2 * window then redis.call('PEXPIRE', KEYS[1], int(2 * window)) end
  return {1}
end
return {0}
