--[[
moongraph.api.langgraph_assistants — the assistants of the LangGraph Agent
API: every script a backend loaded is one, its id its name (the graph id).

  local lgassistants = require "moongraph.api.langgraph_assistants"
  lgassistants.install(B)   -- B:assistants_search(body), B:assistants_count(body), B:assistant(id),
                            -- B:assistant_graph(id), B:assistant_schemas(id)
                            -- on a backend with fields reg (moongraph.worker.scripts)
                            -- and created (wall-clock time, the assistants' date)
  lgassistants.script(reg, id) -> the script named id | nil
]]

local mg = require "moongraph"
local json = require "moongraph.json"
local lgrun = require "moongraph.langgraph_run"
local lgstate = require "moongraph.api.langgraph_state"
local lgrequest = require "moongraph.api.langgraph_request"

local type, ipairs, tostring = type, ipairs, tostring
local null, array = json.null, json.array

local _M = {}

local function isnull(v) return v == nil or v == null end

function _M.script(reg, id)
  if type(id) ~= "string" then return nil end
  for _, s in ipairs(reg.set.list) do
    if s.name == id then return s end
  end
  return nil
end

local function assistant_json(self, s)
  local t = lgrun.iso(self.created)
  return { assistant_id = s.name, graph_id = s.name, name = s.name, description = null,
    config = {}, context = {}, metadata = { created_by = "system" }, version = 1,
    created_at = t, updated_at = t }
end

local function not_found(id) return nil, 404, "assistant '" .. tostring(id) .. "' not found" end

local function matching(self, q)
  local out = {}
  for _, s in ipairs(self.reg.set.list) do
    if (isnull(q.graph_id) or q.graph_id == s.name) and (isnull(q.name) or q.name == s.name)
       and (type(q.metadata) ~= "table" or lgstate.contains({ created_by = "system" }, q.metadata)) then
      out[#out + 1] = assistant_json(self, s)
    end
  end
  return out
end

-- search(body) -> page, total | nil, 422, msg
local function search(self, body)
  local q, st, msg = lgrequest.assistant_search(body or {})
  if not q then return nil, st, msg end
  local out = matching(self, q)
  local page = array()
  for i = q.offset + 1, math.min(#out, q.offset + q.limit) do page[#page + 1] = out[i] end
  return page, #out
end

-- count(body) -> n | nil, 422, msg (body: graph_id, name, metadata)
local function count(self, body)
  body = body or {}
  local q, st, msg = lgrequest.assistant_search { graph_id = body.graph_id, name = body.name,
    metadata = body.metadata }
  if not q then return nil, st, msg end
  return #matching(self, q)
end

local function get(self, id)
  local s = _M.script(self.reg, id)
  if not s then return not_found(id) end
  return assistant_json(self, s)
end

-- the graph as LangGraph's drawable JSON: {nodes = {{id, type, data}}, edges = {{source, target, conditional}}}
local function graph(self, id)
  local s = _M.script(self.reg, id)
  if not s then return not_found(id) end
  local app = s.app
  local render = require "moongraph.render"
  local nodes = array { { id = mg.START, type = "schema", data = mg.START } }
  for _, n in ipairs(app.order) do
    nodes[#nodes + 1] = { id = n, type = "runnable", data = { id = { "moongraph", n }, name = n } }
  end
  nodes[#nodes + 1] = { id = mg.END, type = "schema", data = mg.END }
  local edges = array()
  for _, e in ipairs(render.edges(app)) do
    local edge = { source = e.from, target = e.to, conditional = e.kind == "branch" }
    if e.label then edge.data = e.label end
    edges[#edges + 1] = edge
  end
  return { nodes = nodes, edges = edges }
end

local function schemas(self, id)
  local s = _M.script(self.reg, id)
  if not s then return not_found(id) end
  return { graph_id = s.name, input_schema = null, output_schema = null, state_schema = null,
    config_schema = null, context_schema = null }
end

function _M.install(B)
  B.assistants_search, B.assistants_count = search, count
  B.assistant, B.assistant_graph, B.assistant_schemas = get, graph, schemas
  return B
end

return _M
