-- Planning mode: two agents over the same workspace directory. The basic
-- agent has the tools read_file and write_file; the planning agent has
-- read_file only and answers a change request with a plan instead of
-- making it. The router picks the planning agent when planning mode is on
-- (--plan, PLANNING_MODE=1, or state.mode == "planning").
--
--   ./moongraph run scripts/agents/planning.lua --dir /tmp/ws "write notes.txt: buy milk"
--   ./moongraph run scripts/agents/planning.lua --dir /tmp/ws --plan "write notes.txt: buy bread"
--   ./moongraph run scripts/agents/planning.lua --dir /tmp/ws "read notes.txt"
--
-- Offline the agents understand "read PATH" and "write PATH: TEXT"; with an
-- LLM configured, the LLM turns the request into one tool call from the
-- agent's own tool list.

local mg = require "moongraph"
local common = require "scripts.agents.common"
local json = require "cjson.safe"

local _M = {}

_M.USAGE = "usage: moongraph run scripts/agents/planning.lua [--dir DIR] [--plan] MESSAGE"
_M.DEFAULT_DIR = ".moongraph/agents-workspace"

local function store() return require("moongraph.core").store end

-- a path inside the workspace, or nil, err
local function resolve(dir, path)
  if type(path) ~= "string" or path == "" then return nil, "a file path is needed" end
  if path:sub(1, 1) == "/" or path:find("%.%.") then
    return nil, "path '" .. path .. "' leaves the workspace (use a relative path without '..')"
  end
  return dir .. "/" .. path
end

--[[ tools(dir) -> {read_file = fn(args), write_file = fn(args)}
Each tool returns a result table; failures are results too ({error = msg}),
as an agent's tool call reports them back rather than raising. ]]
function _M.tools(dir)
  return {
    read_file = function(args)
      local full, err = resolve(dir, args.path)
      if not full then return { error = err } end
      local text, rerr = store().read(full)
      if not text then return { error = "cannot read " .. args.path .. ": " .. tostring(rerr) } end
      return { content = text }
    end,
    write_file = function(args)
      local full, err = resolve(dir, args.path)
      if not full then return { error = err } end
      local parent = full:match("^(.*)/[^/]*$")
      local ok, merr = store().mkdir(parent)
      if not ok then return { error = "cannot create " .. parent .. ": " .. tostring(merr) } end
      local wok, werr = store().write(full, args.content or "")
      if not wok then return { error = "cannot write " .. args.path .. ": " .. tostring(werr) } end
      return { result = "wrote " .. #(args.content or "") .. " bytes to " .. args.path }
    end,
  }
end

-- "read PATH" | "write PATH: TEXT" -> action table | nil
function _M.parse_request(text)
  local path = text:match("^%s*[Rr]ead%s+(%S+)%s*$")
  if path then return { tool = "read_file", path = path } end
  local wpath, content = text:match("^%s*[Ww]rite%s+([^:%s]+)%s*:%s?(.*)$")
  if wpath then return { tool = "write_file", path = wpath, content = content } end
  return nil
end

local function tool_schema(names)
  return {
    type = "object",
    properties = {
      tool = { type = "string", enum = names },
      path = { type = "string" },
      content = { type = "string" },
    },
    required = { "tool" },
  }
end

-- the action the request asks for: offline grammar, or one LLM tool call
local function action_of(llm, instruction, names, request)
  if not llm then
    local a = _M.parse_request(request)
    if not a then
      return nil, "offline the agents understand 'read PATH' and 'write PATH: TEXT'"
    end
    return a
  end
  local names_list = {}
  for i, n in ipairs(names) do names_list[i] = n end
  names_list[#names_list + 1] = "none"
  local text, err = common.chat(llm, instruction ..
    " Reply with one JSON object {\"tool\": one of " .. table.concat(names_list, ", ") ..
    ", \"path\": ..., \"content\": ...} for the request.", request,
    { json_schema = tool_schema(names_list) })
  if not text then error(err, 0) end
  local a = json.decode(text)
  if type(a) ~= "table" or type(a.tool) ~= "string" then
    error("the LLM did not return a tool call: " .. text, 0)
  end
  if a.tool == "none" then return nil, "the request needs no file tool" end
  return a
end

--[[ agent(key, instruction, tool_names, dir, llm) -> node function
Runs at most one tool call of the agent's own tools. A request for a tool
the agent lacks is answered, not executed. ]]
function _M.agent(key, instruction, tool_names, dir, llm)
  local all = _M.tools(dir)
  local own = {}
  for _, n in ipairs(tool_names) do own[n] = all[n] end
  return function(state)
    local request = common.question(state)
    local action, why = action_of(llm, instruction, tool_names, request)
    if not action then return common.reply(key, "No tool call: " .. why .. ".") end
    local tool = own[action.tool]
    if not tool then
      -- planning mode: describe the change instead of making it
      local lines = { "Planning mode is read-only: " .. action.tool .. " is not among my tools (" ..
        table.concat(tool_names, ", ") .. "), so nothing was changed.", "Plan:" }
      local cur = own.read_file and own.read_file { path = action.path }
      if cur and cur.content then
        lines[#lines + 1] = "1. " .. action.path .. " exists (" .. #cur.content .. " bytes); review it before replacing it."
      else
        lines[#lines + 1] = "1. " .. tostring(action.path) .. " does not exist yet; it would be created."
      end
      lines[#lines + 1] = "2. Switch planning mode off and run the request again to write " ..
        #(action.content or "") .. " bytes to " .. tostring(action.path) .. "."
      return common.reply(key, table.concat(lines, "\n"), { notes = { key .. ": planned " .. action.tool } })
    end
    local res = tool(action)
    if res.error then return common.reply(key, action.tool .. " failed: " .. res.error) end
    local text = res.content and (action.path .. ":\n" .. res.content) or res.result
    return common.reply(key, text, { notes = { key .. ": " .. action.tool .. " " .. action.path } })
  end
end

function _M.planning_mode(state)
  if type(state) == "table" and state.mode == "planning" then return true end
  local env = os.getenv("PLANNING_MODE")
  return env == "1" or env == "true"
end

function _M.node(opts)
  opts = opts or {}
  local dir = opts.dir or _M.DEFAULT_DIR
  return mg.routed_agent {
    name = "planning_example",
    agents = {
      basic = _M.agent("basic", "You are a basic assistant. Use tools to help the user.",
        { "read_file", "write_file" }, dir, opts.llm),
      planning = _M.agent("planning", "You are a planning expert. Analyze carefully. You can only read files.",
        { "read_file" }, dir, opts.llm),
    },
    router = function(_, ctx)
      local key = _M.planning_mode(ctx.state) and "planning" or "basic"
      if ctx.emit then ctx.emit { routing = (key == "planning" and "planning mode on" or "planning mode off") ..
        ": " .. key .. " agent" } end
      return key
    end,
  }
end

function _M.build(opts)
  return common.graph(_M.node(opts), opts and opts.compile)
end

function _M.main(args)
  local msg, flags, vals = common.parse(args, { ["--plan"] = true }, { ["--dir"] = true })
  if not msg then
    io.stderr:write(flags, "\n", _M.USAGE, "\n")
    return 2
  end
  local input = { question = msg, messages = { { role = "user", content = msg } },
    mode = flags["--plan"] and "planning" or nil }
  return common.main({}, _M.USAGE, function(o)
    o.dir = vals["--dir"]
    return _M.build(o)
  end, function() return input end)
end

if (...) == "scripts.agents.planning" then return _M end
return _M.main({ ... })
