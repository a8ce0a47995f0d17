--[[
moongraph.api.ratelimit — a token bucket per caller.

  local ratelimit = require "moongraph.api.ratelimit"
  local rl = ratelimit.new{ rate = 600, burst = 60 }   -- per minute; burst: bucket size
  local ok, retry_after = rl:take(key)   -- false, seconds to wait (a whole number >= 1)
  local retry_after = rl:empty(key)      -- false while key has a request left (takes none)

Each key's bucket holds up to `burst` requests and refills at `rate` per
minute; a request takes one. rate = 0 turns the limit off. Buckets that
have refilled completely are forgotten, so idle callers cost nothing.
]]

local mg = require "moongraph"

local type, setmetatable, pairs, error = type, setmetatable, pairs, error
local math_ceil, math_min = math.ceil, math.min

local _M = {}
local RL = {}
RL.__index = RL

function _M.new(opts)
  opts = opts or {}
  local rate, burst = opts.rate or 600, opts.burst
  if type(rate) ~= "number" or rate < 0 then
    error("bad argument #1 to 'new': rate must be >= 0 requests per minute", 2)
  end
  if burst == nil then burst = math.max(1, math_ceil(rate / 10)) end
  if type(burst) ~= "number" or burst < 1 then
    error("bad argument #1 to 'new': burst must be >= 1", 2)
  end
  return setmetatable({ per_sec = rate / 60, burst = burst, buckets = {}, n = 0,
                        clock = opts.clock or mg.now }, RL)
end

local function sweep(self, now)
  for k, b in pairs(self.buckets) do
    if b.tokens + (now - b.t) * self.per_sec >= self.burst then
      self.buckets[k] = nil
      self.n = self.n - 1
    end
  end
end

-- take(key) -> true | false, retry_after (seconds)
function RL:take(key)
  if self.per_sec == 0 then return true end
  local now = self.clock()
  local b = self.buckets[key]
  if not b then
    if self.n >= 10000 then sweep(self, now) end
    b = { tokens = self.burst, t = now }
    self.buckets[key] = b
    self.n = self.n + 1
  else
    b.tokens = math_min(self.burst, b.tokens + (now - b.t) * self.per_sec)
    b.t = now
  end
  if b.tokens >= 1 then
    b.tokens = b.tokens - 1
    return true
  end
  return false, math.max(1, math_ceil((1 - b.tokens) / self.per_sec))
end

-- empty(key) -> false | retry_after: the key's bucket has no request left
function RL:empty(key)
  if self.per_sec == 0 then return false end
  local b = self.buckets[key]
  if not b then return false end
  local tokens = math_min(self.burst, b.tokens + (self.clock() - b.t) * self.per_sec)
  if tokens >= 1 then return false end
  return math.max(1, math_ceil((1 - tokens) / self.per_sec))
end

return _M
