-- Figures of a list of samples, for the benchmarks.
local _M = {}

-- The median (the mean of the two middle values of an even count); nil
-- for no samples. The list is not changed.
function _M.median(list)
  if not list or #list == 0 then return nil end
  local s = {}
  for i, v in ipairs(list) do s[i] = v end
  table.sort(s)
  local n = #s
  return n % 2 == 1 and s[(n + 1) // 2] or (s[n // 2] + s[n // 2 + 1]) / 2
end

-- The p-th percentile of a sorted list (nearest rank).
function _M.percentile(sorted, p)
  return sorted[math.max(1, math.ceil(p / 100 * #sorted))]
end

return _M
