--[[
moongraph.commands — which commands the `moongraph` executable has.

Runtime commands are the runtime's own: each is the module
moongraph.cmd.NAME, listed below with its one-line summary. Application
commands live with their application: a directory scripts/APP/ beside the
modules (see moongraph.paths) that holds a commands.lua declaring them

  -- scripts/eco/commands.lua
  return {
    chat = { summary = "ask the Eco² chat pipeline", module = "scripts.eco.chat_command" },
  }

where each module returns { main = function(args) -> exit status }. The
declaration is read without loading the commands themselves, so `help` stays
cheap. A runtime command wins over an application's of the same name; among
applications, the first root on the module path wins, then the first
application by name.

  commands.runtime()   -> { {name, summary, module}, ... }
  commands.apps()      -> { {name, summary, module, app}, ... }   (inside a task)
  commands.find(name)  -> command | nil                           (inside a task)

An application may also declare what `moongraph serve` serves when it is
given no --script, in scripts/APP/serve.lua:

  -- scripts/eco/serve.lua
  return { { name = "chat", path = "scripts/eco/chat.lua" } }

  commands.served()    -> { "NAME=PATH", ... } | nil, err             (inside a task)
                          every application's, in the same order (a name
                          taken by an earlier one is skipped)
]]

local type, pairs, ipairs, pcall, tostring, require, error =
  type, pairs, ipairs, pcall, tostring, require, error
local table_sort = table.sort

local paths = require "moongraph.paths"

local _M = {}

local RUNTIME = {
  worker = "run jobs from a Redis stream (results in Postgres)",
  submit = "enqueue a job for the workers; --follow prints its events as they arrive",
  mcp = "serve the tools a Lua file declares over MCP (mcp serve FILE.lua)",
  draw = "draw the graph a script builds (svg, png, pdf via Graphviz; dot, mermaid)",
  serve = "serve the Chat API, the LangGraph Agent API and the web chat page (HTTP + SSE; docs/api.md)",
}

local function by_name(a, b) return a.name < b.name end

function _M.runtime()
  local out = {}
  for name, summary in pairs(RUNTIME) do
    out[#out + 1] = { name = name, summary = summary, module = "moongraph.cmd." .. name }
  end
  table_sort(out, by_name)
  return out
end

-- The applications on the module path with a scripts/APP/<what>.lua
-- (commands, serve), in search order.
local function app_names(what)
  local files = require("moongraph.core").files
  local names, seen = {}, {}
  for _, root in ipairs(paths.roots()) do
    local list = files.list(root .. "scripts")
    if list then
      for _, app in ipairs(list) do
        if not seen[app] and app:find("^[%w_]+$") and
           package.searchpath("scripts." .. app .. "." .. what, package.path) then
          seen[app] = true
          names[#names + 1] = app
        end
      end
    end
  end
  return names
end

-- apps() -> the application commands (a declaration that fails to load is
-- reported as a command whose `error` says why).
function _M.apps()
  local out, taken = {}, {}
  for name in pairs(RUNTIME) do taken[name] = true end
  for _, app in ipairs(app_names("commands")) do
    local ok, decl = pcall(require, "scripts." .. app .. ".commands")
    if not ok or type(decl) ~= "table" then
      out[#out + 1] = { name = app, app = app, summary = "(cannot load scripts/" .. app ..
        "/commands.lua)", error = tostring(ok and "it does not return a table" or decl) }
    else
      local mine = {}
      for name, c in pairs(decl) do
        if type(name) == "string" and type(c) == "table" and not taken[name] then
          taken[name] = true
          mine[#mine + 1] = { name = name, summary = c.summary or "", module = c.module, app = app }
        end
      end
      table_sort(mine, by_name)
      for _, c in ipairs(mine) do out[#out + 1] = c end
    end
  end
  return out
end

function _M.served()
  local out, taken = {}, {}
  for _, app in ipairs(app_names("serve")) do
    local ok, decl = pcall(require, "scripts." .. app .. ".serve")
    if not ok or type(decl) ~= "table" then
      return nil, "scripts/" .. app .. "/serve.lua: " .. tostring(ok and "it does not return a list" or decl)
    end
    for i, s in ipairs(decl) do
      if type(s) ~= "table" or type(s.name) ~= "string" or type(s.path) ~= "string" then
        return nil, "scripts/" .. app .. "/serve.lua: entry " .. i .. " must be {name = NAME, path = PATH}"
      end
      if not taken[s.name] then
        taken[s.name] = true
        out[#out + 1] = s.name .. "=" .. s.path
      end
    end
  end
  return out
end

function _M.find(name)
  if type(name) ~= "string" then
    error("bad argument #1 to 'find': command name expected, got " .. type(name), 2)
  end
  if RUNTIME[name] then
    return { name = name, summary = RUNTIME[name], module = "moongraph.cmd." .. name }
  end
  for _, c in ipairs(_M.apps()) do
    if c.name == name and not c.error then return c end
  end
  return nil
end

return _M
