-- Shared by the routed-agent examples (scripts/agents/): the LLM client
-- configured by the environment, chat helpers, the one-node graph every
-- example wraps its routed agent in, and the command-line front end.

local mg = require "moongraph"

local _M = {}

-- The reply text of an LLM chat result: a string, or a table carrying
-- content / text / message.content / choices[1].message.content.
function _M.reply_text(res)
  if type(res) == "string" then return res end
  if type(res) ~= "table" then return nil end
  if type(res.content) == "string" then return res.content end
  if type(res.text) == "string" then return res.text end
  if type(res.message) == "table" and type(res.message.content) == "string" then
    return res.message.content
  end
  local c = type(res.choices) == "table" and res.choices[1]
  if type(c) == "table" and type(c.message) == "table" and type(c.message.content) == "string" then
    return c.message.content
  end
  return nil
end

-- chat(llm, system, user [, extra]) -> text | nil, err. extra: fields added
-- to the request (model, json_schema, ...).
function _M.chat(llm, system, user, extra)
  local req = { messages = { { role = "system", content = system }, { role = "user", content = user } } }
  for k, v in pairs(extra or {}) do req[k] = v end
  local res, err = llm:chat(req)
  if not res then return nil, "LLM call failed: " .. tostring(err) end
  local text = _M.reply_text(res)
  if not text or not text:find("%S") then return nil, "the LLM returned no text" end
  return text
end

-- The question of a state: the last user message, else state.question.
function _M.question(state)
  return require("moongraph.routed_agent").user_message(state) or state.question or ""
end

--[[ graph(node) -> compiled graph START -> agent -> END over the state
{messages, question, answer, agent, notes}. The agent node is the routed
agent; each agent writes `answer` and `agent` (its key). ]]
function _M.graph(node, opts)
  local g = mg.graph {
    messages = mg.reducers.messages, question = "last", answer = "last", agent = "last",
    notes = mg.reducers.append, mode = "last", classification = "last",
  }
  g:add_node("agent", node)
  g:add_edge(mg.START, "agent")
  return g:compile(opts)
end

-- An update that answers: the assistant message, the answer and the agent.
function _M.reply(key, text, extra)
  local up = { answer = text, agent = key, messages = { { role = "assistant", content = text } } }
  for k, v in pairs(extra or {}) do up[k] = v end
  return up
end

-- args -> the input state of a plain question (every word is the message).
function _M.input(args)
  local msg, err = _M.parse(args)
  if not msg then return nil, err end
  return { question = msg, messages = { { role = "user", content = msg } } }
end

--[[ main(args, usage, build [, input_of]) -> exit status
The command line of an example: the arguments (after the script path) are
the message; options are handled by input_of(args) -> state | nil, err
(default: input, a plain question).
Streams the run: custom events (routing decisions) print as they happen,
then the answer and the agent that gave it. ]]
function _M.main(args, usage, build, input_of)
  local input, err = (input_of or _M.input)(args)
  if not input then
    io.stderr:write(err, "\n", usage, "\n")
    return 2
  end
  -- without MOONGRAPH_LLM_* the examples use their offline agents
  local app = build { llm = (require("moongraph.llm").from_env()) }
  local final = nil
  local ok, e = pcall(function()
    for ev in app:stream(input, { modes = { "custom", "values" } }) do
      if ev.mode == "custom" and type(ev.data) == "table" and ev.data.routing then
        io.stdout:write("[routing] ", ev.data.routing, "\n")
      elseif ev.mode == "values" then
        final = ev.data
      end
    end
  end)
  if not ok then
    io.stderr:write("error: ", tostring(e):match("^[^\n]*"), "\n")
    return 1
  end
  io.stdout:write("[agent] ", tostring(final.agent), "\n", tostring(final.answer), "\n")
  return 0
end

-- args -> the message (all non-option words joined), the set of flags
-- given in `flags` ({["--plan"] = true}) and the values of `valued` options.
function _M.parse(args, flags, valued)
  local words, set, vals = {}, {}, {}
  local i = 1
  while i <= #args do
    local a = args[i]
    if flags and flags[a] then
      set[a] = true
    elseif valued and valued[a] then
      local v = args[i + 1]
      if not v then return nil, a .. " needs a value" end
      vals[a] = v
      i = i + 1
    elseif a:sub(1, 2) == "--" then
      return nil, "unknown option " .. a
    else
      words[#words + 1] = a
    end
    i = i + 1
  end
  local msg = table.concat(words, " ")
  if not msg:find("%S") then return nil, "missing MESSAGE" end
  return msg, set, vals
end

return _M
