--[[
The pipeline's data tools called over MCP: the five tools of
scripts/marketing/tools.lua, served by `moongraph mcp serve
scripts/marketing/tools.lua` in a child process and called through the MCP
client (moongraph.mcp), as the seed's data collector calls its MCP server.

  local T = require("scripts.marketing.mcp_tools").new{ data_dir = ..., pg_url = ... }
  T.search_merchant("본죽")  -- the same values as tools.new(backend).search_merchant
  T.close()

The server is started on the first call (inside a task) and started again
if it has died. A call that fails (server cannot start, crashed, timed out,
refused the input) comes back the way a backend failure does:
{found = false, merchants = {}, error = ...} or {success = false, error = ...}.

opts: data_dir, pg_url (passed to the server's environment), command (the
server's argument list; default: this moongraph binary, or MOONGRAPH_BIN
outside it), timeout (seconds per call, default 30).
]]

local mcp = require "moongraph.mcp"
local paths = require "moongraph.paths"
local tools_mod = require "scripts.marketing.tools"

local _M = {}

-- The moongraph executable: ourselves when running inside it (the child of
-- a fork sees its parent's binary as /proc/self/exe), else MOONGRAPH_BIN or
-- ./moongraph (plain lua5.4 with moongraph on its path, as the specs run).
function _M.moongraph_bin()
  local env = os.getenv("MOONGRAPH_BIN")
  if env and env ~= "" then return env end
  if package.preload["moongraph.repl_core"] then return "/proc/self/exe" end
  return "./moongraph"
end

function _M.default_command()
  local file = paths.find("scripts/marketing/tools.lua") or "scripts/marketing/tools.lua"
  return { _M.moongraph_bin(), "mcp", "serve", file }
end

function _M.new(opts)
  opts = opts or {}
  local env = { MARKETING_DATA_DIR = opts.data_dir, MARKETING_PG_URL = opts.pg_url,
    MOONGRAPH_PATH = os.getenv("MOONGRAPH_PATH") }
  local conn, connecting = nil, nil
  local T = {}

  local function client()
    if conn and conn:alive() then return conn end
    while connecting do connecting:get() end   -- another task is starting it
    if conn and conn:alive() then return conn end
    local mg = require "moongraph"
    local q = mg.queue()
    connecting = q
    local c, err
    if conn then
      local ok, rerr = conn:reconnect()
      c, err = ok and conn or nil, rerr
    else
      c, err = mcp.connect { command = opts.command or _M.default_command(), env = env,
        name = "marketing data server", timeout = opts.timeout or 30 }
    end
    conn = c or conn
    connecting = nil
    q:close()
    if not c then return nil, err end
    return c
  end

  local function call(name, arg_name, value)
    local c, err = client()
    if not c then return nil, err end
    local r, cerr = c:call_tool(name, { [arg_name] = value })
    if not r then return nil, cerr end
    if r.isError then return nil, mcp.text(r) end
    if type(r.structuredContent) ~= "table" then
      return nil, "marketing data server: " .. name .. " returned no structured content"
    end
    return r.structuredContent
  end

  for _, d in ipairs(tools_mod.MCP_TOOLS) do
    local name, arg = d.name, d.arg
    T[name] = function(value)
      local v, err = call(name, arg, value)
      if v then return v end
      if name == "search_merchant" then return { found = false, merchants = {}, error = err } end
      return { success = false, error = err }
    end
  end

  function T.close()
    if conn then conn:close() end
  end

  T.transport = "mcp"
  return T
end

return _M
