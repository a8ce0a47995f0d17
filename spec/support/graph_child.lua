-- Run a Lua script in a separate lua5.4 process that can load moongraph
-- from this checkout (crash and cross-process specs).
local _M = {}

local root
local function repo_root()
  if not root then
    local p = io.popen("pwd")
    root = p:read("l")
    p:close()
  end
  return root
end

-- script(body) -> path of a temporary script: body with package paths set
function _M.script(body)
  local r = repo_root()
  local libdir = os.getenv("MOONGRAPH_LIBDIR") or "lib"
  if libdir:sub(1, 1) ~= "/" then libdir = r .. "/" .. libdir end
  local header = string.format(
    "package.path = %q .. package.path\npackage.cpath = %q .. package.cpath\n",
    r .. "/runtime/lua/?.lua;" .. r .. "/runtime/lua/?/init.lua;",
    libdir .. "/?.so;")
  local path = os.tmpname()
  local f = assert(io.open(path, "w"))
  f:write(header, body)
  f:close()
  return path
end

-- run(path, ...) -> output, exit kind ("exit"|"signal"), code
function _M.run(path, ...)
  local args = {}
  for i, a in ipairs { ... } do args[i] = string.format("%q", tostring(a)) end
  local p = io.popen("exec lua5.4 " .. path .. " " .. table.concat(args, " ") .. " 2>&1")
  local out = p:read("a")
  local _, kind, code = p:close()
  return out, kind, code
end

function _M.tmpdir()
  local p = os.tmpname()
  os.remove(p)
  return p
end

function _M.lines(path)
  local out = {}
  local f = io.open(path)
  if not f then return out end
  for l in f:lines() do out[#out + 1] = l end
  f:close()
  return out
end

return _M
