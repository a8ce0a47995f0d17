-- Resident memory of this process from /proc (KiB): current and peak.
local _M = {}
local function field(name)
  local f = io.open("/proc/self/status")
  if not f then return nil end
  for line in f:lines() do
    local v = line:match("^" .. name .. ":%s+(%d+) kB")
    if v then f:close(); return tonumber(v) end
  end
  f:close()
end
function _M.current() return field("VmRSS") end
function _M.peak() return field("VmHWM") end
return _M
