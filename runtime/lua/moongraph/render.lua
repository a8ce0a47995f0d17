--[[
moongraph.render — diagrams of a compiled graph (app:mermaid(), app:dot()).

Plain edges are solid; conditional edges are dashed and labelled with their
path_map label when it differs from the target (a router without path_map
may go anywhere, so it gets a dashed edge to every node and to END); join
edges carry the label "join"; fallback nodes hang off their primary with a
dotted "fallback" edge, Command destinations with a dotted "command" edge.
Subgraph nodes are drawn as subroutine boxes. A node with no way out ends
the run, so it gets an edge to END.
]]

local ipairs, string_gsub, table_concat = ipairs, string.gsub, table.concat

local control = require "moongraph.control"
local START, END = control.START, control.END

local _M = {}

-- the graph as a list of edges {from, to, kind, label}
local function edges_of(app)
  local out = {}
  local function add(from, to, kind, label)
    out[#out + 1] = { from = from, to = to, kind = kind, label = label }
  end
  for _, e in ipairs(app.edges) do add(e.from, e.to, "edge") end
  for _, j in ipairs(app.joins) do
    for _, s in ipairs(j.sources) do add(s, j.target, "join", "join") end
  end
  for _, b in ipairs(app.branches) do
    if b.map then
      for _, label in ipairs(b.labels) do
        local target = b.map[label]
        add(b.source, target, "branch", label ~= target and label or nil)
      end
    else
      for _, n in ipairs(app.order) do add(b.source, n, "branch") end
      add(b.source, END, "branch")
    end
  end
  local has_out = {}
  for _, e in ipairs(out) do has_out[e.from] = true end
  for _, n in ipairs(app.order) do
    local spec = app.nodes[n]
    if spec.fallback then add(n, spec.fallback, "fallback", "fallback") end
    if spec.destinations then
      for _, d in ipairs(spec.destinations) do add(n, d, "command", "command") end
    end
    if not has_out[n] and not (spec.destinations and spec.destinations[1]) then
      add(n, END, "edge")
    end
  end
  return out
end

local function mermaid_id(name)
  if name == START then return "__start__" end
  if name == END then return "__end__" end
  return "n_" .. string_gsub(name, "[^%w_]", function(c) return string.format("_%02x", c:byte()) end)
end

local function mermaid_text(s)
  return (string_gsub(s, '"', "#quot;"))
end

function _M.mermaid(app)
  local lines = { "flowchart TD" }
  lines[#lines + 1] = "  __start__([START])"
  for _, n in ipairs(app.order) do
    local spec = app.nodes[n]
    local id, text = mermaid_id(n), mermaid_text(n)
    if spec.sub then
      lines[#lines + 1] = "  " .. id .. '[["' .. text .. '"]]'
    else
      lines[#lines + 1] = "  " .. id .. '["' .. text .. '"]'
    end
  end
  lines[#lines + 1] = "  __end__([END])"
  for _, e in ipairs(edges_of(app)) do
    local a, b = mermaid_id(e.from), mermaid_id(e.to)
    local arrow
    if e.kind == "edge" then
      arrow = " --> "
    elseif e.kind == "join" then
      arrow = ' -->|"join"| '
    elseif e.kind == "branch" then
      arrow = e.label and (' -.->|"' .. mermaid_text(e.label) .. '"| ') or " -.-> "
    else
      arrow = ' -.->|"' .. e.label .. '"| '
    end
    lines[#lines + 1] = "  " .. a .. arrow .. b
  end
  return table_concat(lines, "\n") .. "\n"
end

local function dot_q(s)
  return '"' .. string_gsub(s, '["\\]', "\\%0") .. '"'
end

function _M.dot(app)
  local lines = { "digraph " .. dot_q(app.name or "graph") .. " {", "  rankdir=TB;" }
  lines[#lines + 1] = "  " .. dot_q(START) .. ' [label="START", shape=oval];'
  for _, n in ipairs(app.order) do
    local spec = app.nodes[n]
    lines[#lines + 1] = "  " .. dot_q(n) .. (spec.sub and " [shape=box, peripheries=2];" or " [shape=box];")
  end
  lines[#lines + 1] = "  " .. dot_q(END) .. ' [label="END", shape=oval];'
  for _, e in ipairs(edges_of(app)) do
    local attrs = {}
    if e.kind == "branch" then attrs[#attrs + 1] = "style=dashed"
    elseif e.kind == "fallback" or e.kind == "command" then attrs[#attrs + 1] = "style=dotted" end
    if e.label then attrs[#attrs + 1] = "label=" .. dot_q(e.label) end
    local a = #attrs > 0 and (" [" .. table_concat(attrs, ", ") .. "]") or ""
    lines[#lines + 1] = "  " .. dot_q(e.from) .. " -> " .. dot_q(e.to) .. a .. ";"
  end
  lines[#lines + 1] = "}"
  return table_concat(lines, "\n") .. "\n"
end

return _M
