-- Helpers for specs that run the moongraph executable.
local _M = {}

_M.bin = os.getenv("MOONGRAPH_BIN") or "./moongraph"

local function shell_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end
_M.quote = shell_quote

-- run(args, {stdin = string}) -> {code, out, err}
function _M.run(args, opts)
  opts = opts or {}
  local parts = { _M.bin }
  for _, a in ipairs(args) do parts[#parts + 1] = shell_quote(a) end
  local dir = os.tmpname()
  os.remove(dir)
  local outf, errf, inf = dir .. ".out", dir .. ".err", dir .. ".in"
  local f = assert(io.open(inf, "w"))
  f:write(opts.stdin or "")
  f:close()
  local cmd = table.concat(parts, " ") .. " <" .. inf .. " >" .. outf .. " 2>" .. errf
  if opts.env then cmd = opts.env .. " " .. cmd end
  local _, _, code = os.execute(cmd)
  local function slurp(p)
    local h = io.open(p, "r")
    local s = h and h:read("a") or ""
    if h then h:close() end
    os.remove(p)
    return s
  end
  local res = { code = code, out = slurp(outf), err = slurp(errf) }
  os.remove(inf)
  return res
end

function _M.write_temp(contents, suffix)
  local p = os.tmpname() .. (suffix or ".lua")
  local f = assert(io.open(p, "w"))
  f:write(contents)
  f:close()
  return p
end

return _M
