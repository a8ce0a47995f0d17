-- Helpers for specs that run the moongraph executable.
local tmp = require "tmp"

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
  local dir = tmp.dir("cli")
  local outf, errf, inf = dir .. "/out", dir .. "/err", dir .. "/in"
  local f = assert(io.open(inf, "w"))
  f:write(opts.stdin or "")
  f:close()
  local cmd = table.concat(parts, " ") .. " <" .. inf .. " >" .. outf .. " 2>" .. errf
  if opts.env then cmd = opts.env .. " " .. cmd end
  local _, _, code = os.execute(cmd)
  local function slurp(p)
    local h = assert(io.open(p, "r"))
    local s = h:read("a")
    h:close()
    return s
  end
  local res = { code = code, out = slurp(outf), err = slurp(errf) }
  tmp.remove(dir)
  return res
end

-- A file holding contents (a script: suffix ".lua" by default), removed
-- with its directory when the test ends (spec/support/tmp.lua).
function _M.write_temp(contents, suffix)
  return tmp.file(contents, "script" .. (suffix or ".lua"), "cli")
end

return _M
