--[[
moongraph.prebuilt — tool-calling agents (mg.prebuilt), LangGraph's
ToolNode and create_react_agent on moongraph.

  local agent = mg.prebuilt.react_agent{
    llm = client,                      -- moongraph.llm client (or llm.routed)
    tools = { weather_tool, table.unpack(mcp_client:list_tools()) },
    prompt = "You are a helpful assistant.",
    max_steps = 10,
  }
  local out = assert(agent:invoke{ messages = { { role = "user", content = "weather in Seoul?" } } })
  print(out.messages[#out.messages].content)

A tool is either
  { name, description, parameters | inputSchema (JSON schema of the
    arguments), fn | handler = function(args, ctx) -> value | nil, err }
or an MCP tool from client:list_tools() (called through its client).
A string result is the tool message's content; another value is sent as
JSON; an MCP result as its text.

tool_node(tools) is a node: it runs every tool call of the last assistant
message at once, each in its own task, and appends one tool message per
call in the order of the calls. A tool that raises, returns nil, err, gets
arguments its schema refuses, or does not exist becomes an error message
for the model ("Error: ... Please fix your mistakes."), as LangGraph's
ToolNode does; the run goes on.

react_agent{...} is the graph model -> tools -> model: it stops when the
model answers without tool calls. After max_steps model calls that still
ask for tools the run fails with a clear error. The model's tokens stream
as `messages` events (app:stream(input, {stream_mode = "messages"})).
]]

local errors = require "moongraph.errors"
local json = require "moongraph.json"
local cjson = json.wire()
local jsonschema = require "moongraph.jsonschema"

local type, pairs, ipairs, tostring, error, setmetatable, getmetatable, pcall =
      type, pairs, ipairs, tostring, error, setmetatable, getmetatable, pcall
local string_format, table_concat = string.format, table.concat

local _M = {}

local mg_mod
local function mg()
  mg_mod = mg_mod or require "moongraph"
  return mg_mod
end

local function is_mcp_tool(t)
  local mt = getmetatable(t)
  return mt ~= nil and type(mt.__index) == "table" and mt.__index.is_mcp_tool == true
end

-- Normalise one tool to {name, description, schema, call}.
local function normalise(t, i)
  local where = "tools[" .. tostring(i) .. "]"
  if type(t) ~= "table" then error("bad argument: " .. where .. " must be a table", 4) end
  if type(t.name) ~= "string" or t.name == "" then error("bad argument: " .. where .. " needs a name", 4) end
  local schema = t.parameters or t.inputSchema or { type = "object", properties = {} }
  if type(schema) ~= "table" then error("bad argument: tool '" .. t.name .. "': schema must be a table", 4) end
  local call
  if is_mcp_tool(t) then
    call = function(args)
      local r, err = t:call(args)
      if not r then return nil, err end
      local text = require("moongraph.mcp").text(r)
      if text == "" and r.structuredContent ~= nil then text = cjson.encode(r.structuredContent) or "" end
      if r.isError then return nil, text ~= "" and text or "the tool reported an error" end
      return text
    end
  else
    local fn = t.fn or t.handler
    if type(fn) ~= "function" then
      error("bad argument: tool '" .. t.name .. "' needs fn = function(args, ctx)", 4)
    end
    call = fn
  end
  return { name = t.name, description = t.description, schema = schema, call = call,
    validate = not is_mcp_tool(t) }
end

local function normalise_all(tools, fname)
  if type(tools) ~= "table" then
    error("bad argument #1 to '" .. fname .. "': list of tools expected, got " .. type(tools), 3)
  end
  local list, by_name = {}, {}
  for i, t in ipairs(tools) do
    local n = normalise(t, i)
    if by_name[n.name] then error("bad argument #1 to '" .. fname .. "': two tools are named '" .. n.name .. "'", 3) end
    list[i], by_name[n.name] = n, n
  end
  return list, by_name
end

-- The tools as the chat API's `tools` parameter.
local function specs(list)
  local out = {}
  for i, t in ipairs(list) do
    out[i] = { name = t.name, description = t.description, parameters = t.schema }
  end
  return out
end

local function content_of(v)
  if type(v) == "string" then return v end
  local s = cjson.encode(v)
  return s or tostring(v)
end

local short = require("moongraph.text").error_message

local function error_message(err)
  return "Error: " .. short(err) .. "\n Please fix your mistakes."
end

-- Run one tool call; returns the tool message.
local function run_call(call, by_name, names, ctx)
  local id = call.id
  local name = call.name or (call["function"] and call["function"].name)
  local msg = { role = "tool", tool_call_id = id, name = name }
  local t = by_name[name]
  if not t then
    msg.content = string_format("Error: %s is not a valid tool, try one of [%s].", tostring(name), names)
    msg.status = "error"
    return msg
  end
  local args = call.args
  if args == nil then
    local raw = call["function"] and call["function"].arguments
    if type(raw) == "string" and raw:find("%S") then
      args = cjson.decode(raw)
      if type(args) ~= "table" then
        msg.content = error_message("the arguments are not a JSON object: " .. raw)
        msg.status = "error"
        return msg
      end
    else
      args = {}
    end
  end
  if t.validate then
    local verr = jsonschema.validate(t.schema, args)
    if verr then
      msg.content = error_message("invalid arguments for tool " .. name .. ": " .. verr)
      msg.status = "error"
      return msg
    end
  end
  local ok, v, err = pcall(t.call, args, ctx)
  if not ok then
    msg.content, msg.status = error_message(v), "error"
  elseif v == nil then
    msg.content, msg.status = error_message(err or ("tool " .. name .. " returned nothing")), "error"
  else
    msg.content = content_of(v)
  end
  return msg
end

local function last_ai(messages)
  for i = #messages, 1, -1 do
    local m = messages[i]
    if type(m) == "table" and m.role == "assistant" then return m end
    if type(m) == "table" and m.role == "tool" then return nil end
  end
end

--[[ tool_node(tools) -> node function(state, ctx) -> {messages = {tool messages}} ]]
function _M.tool_node(tools)
  local list, by_name = normalise_all(tools, "tool_node")
  local names = {}
  for i, t in ipairs(list) do names[i] = t.name end
  names = table_concat(names, ", ")
  return function(state, ctx)
    local msgs = state.messages or {}
    local ai = msgs[#msgs]
    if type(ai) ~= "table" or ai.role ~= "assistant" then ai = last_ai(msgs) end
    local calls = ai and ai.tool_calls or {}
    if #calls == 0 then return nil end
    local fns = {}
    for i, call in ipairs(calls) do
      fns[i] = function() return run_call(call, by_name, names, ctx) end
    end
    local out = {}
    for i, r in ipairs(mg().gather(fns)) do
      if r.ok then out[i] = r.value
      else
        out[i] = { role = "tool", tool_call_id = calls[i].id, name = calls[i].name,
          content = error_message(r.err), status = "error" }
      end
    end
    return { messages = out }
  end
end

-- The assistant message to keep in the state, with tool calls in the
-- chat API's own form (what the next request sends back).
local function assistant_message(r)
  local m = { role = "assistant", content = r.content }
  if r.tool_calls and #r.tool_calls > 0 then
    local calls = {}
    for i, c in ipairs(r.tool_calls) do
      local fn = c["function"] or {}
      local args = fn.arguments
      if type(args) ~= "string" then args = cjson.encode(c.args or {}) or "{}" end
      calls[i] = { id = c.id or ("call_" .. i), type = "function",
        ["function"] = { name = fn.name or c.name, arguments = args }, name = fn.name or c.name, args = c.args }
    end
    m.tool_calls = calls
  end
  return m
end

-- Messages as the chat API wants them: tool calls without our extra fields.
local function wire_messages(prompt, messages)
  local out = {}
  if prompt then out[1] = { role = "system", content = prompt } end
  for _, m in ipairs(messages) do
    if type(m) == "string" then m = { role = "user", content = m } end
    local w = { role = m.role, content = m.content, name = m.role == "tool" and nil or m.name,
      tool_call_id = m.tool_call_id }
    if m.tool_calls then
      local calls = {}
      for i, c in ipairs(m.tool_calls) do
        calls[i] = { id = c.id, type = c.type or "function", ["function"] = c["function"] }
      end
      w.tool_calls = calls
      if w.content == nil then w.content = cjson.null end
    elseif w.content == nil then
      w.content = ""
    end
    out[#out + 1] = w
  end
  return out
end

local AGENT_OPTIONS = { llm = true, tools = true, prompt = true, max_steps = true, name = true,
  checkpointer = true, model = true, temperature = true, tool_choice = true, stream = true }

--[[ react_agent{llm, tools, prompt, max_steps, ...} -> compiled graph
llm: a moongraph.llm client (anything with :chat{messages, tools, stream});
tools: see above; prompt: a system prompt string, or function(state) ->
list of messages to send; max_steps: model calls before the run fails
(default 10); model, temperature, tool_choice: passed to chat; stream
(default true): model tokens as `messages` events; name, checkpointer:
for compile. State: messages (mg.reducers.messages); max_steps counts the
model calls since the last user message. ]]
function _M.react_agent(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'react_agent': options table expected, got " .. type(opts), 2)
  end
  for k in pairs(opts) do
    if not AGENT_OPTIONS[k] then error("bad argument #1 to 'react_agent': unknown option '" .. tostring(k) .. "'", 2) end
  end
  local llm = opts.llm
  if type(llm) ~= "table" or type(llm.chat) ~= "function" then
    error("bad argument #1 to 'react_agent': llm must be a client with a chat method", 2)
  end
  local prompt = opts.prompt
  if prompt ~= nil and type(prompt) ~= "string" and type(prompt) ~= "function" then
    error("bad argument #1 to 'react_agent': prompt must be a string or a function(state)", 2)
  end
  local max_steps = opts.max_steps or 10
  if math.type(max_steps) ~= "integer" or max_steps < 1 then
    error("bad argument #1 to 'react_agent': max_steps must be an integer >= 1", 2)
  end
  local list = normalise_all(opts.tools or {}, "react_agent")
  local tool_specs = specs(list)
  local stream = opts.stream ~= false

  local M = mg()
  local g = M.graph { messages = M.reducers.messages }
  g:add_node("agent", function(state, ctx)
    -- model calls of this turn: assistant messages since the last user one
    local steps = 0
    local all = state.messages or {}
    for i = #all, 1, -1 do
      local role = type(all[i]) == "table" and all[i].role or "user"
      if role == "user" then break end
      if role == "assistant" then steps = steps + 1 end
    end
    if steps >= max_steps then
      error(string_format("react_agent: the model still asks for tools after max_steps = %d model calls; " ..
        "raise max_steps or check the tools' results", max_steps), 0)
    end
    local msgs
    if type(prompt) == "function" then msgs = wire_messages(nil, prompt(state))
    else msgs = wire_messages(prompt, state.messages or {}) end
    local req = { messages = msgs, model = opts.model, temperature = opts.temperature,
      tool_choice = opts.tool_choice }
    if #tool_specs > 0 then req.tools = tool_specs end
    if stream then req.stream = ctx.stream_token end
    local r, err = llm:chat(req)
    if not r then error(errors.wrap(err, nil, "react_agent: the model call failed: " .. tostring(err)), 0) end
    return { messages = { assistant_message(r) } }
  end)
  g:add_node("tools", _M.tool_node(opts.tools or {}))
  g:add_edge(M.START, "agent")
  g:add_conditional_edges("agent", function(state)
    local m = state.messages[#state.messages]
    if m and m.tool_calls and #m.tool_calls > 0 then return "tools" end
    return M.END
  end, { "tools", M.END })
  g:add_edge("tools", "agent")
  return g:compile {
    name = opts.name or "react_agent", checkpointer = opts.checkpointer,
    -- every model call and every tools step is a superstep; the error above
    -- speaks first
    recursion_limit = 2 * max_steps + 5,
  }
end

return _M
