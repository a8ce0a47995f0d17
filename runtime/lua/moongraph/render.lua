--[[
moongraph.render — diagrams of a compiled graph (app:mermaid(), app:dot()).

Plain edges are solid; conditional edges are dashed and labelled with their
path_map label when it differs from the target (a router without path_map
may go anywhere, so it gets a dashed edge to every node and to END); join
edges carry the label "join"; fallback nodes hang off their primary with a
dotted "fallback" edge, Command destinations with a dotted "command" edge.
In mermaid, subgraph nodes are subroutine boxes; in dot, clusters that
show the subgraph inside. A node with no way out ends
the run, so it gets an edge to END.
]]

local ipairs, string_gsub, table_concat = ipairs, string.gsub, table.concat

local errors = require "moongraph.errors"
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
-- render.edges(app) -> that list (the LangGraph API's drawing of a graph)
_M.edges = edges_of

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

local function dot_attrs(e)
  local attrs = {}
  if e.kind == "branch" then attrs[#attrs + 1] = "style=dashed"
  elseif e.kind == "fallback" or e.kind == "command" then attrs[#attrs + 1] = "style=dotted" end
  if e.label then attrs[#attrs + 1] = "label=" .. dot_q(e.label) end
  return #attrs > 0 and (" [" .. table_concat(attrs, ", ") .. "]") or ""
end

--[[ The body of one graph: its nodes (a subgraph node as a cluster holding
the subgraph, drawn the same way) and its edges. prefix names the nodes of a
nested graph apart ("outer/inner"); the ids of its START and END are where
the parent's edges into and out of the subgraph node attach. ]]
local function dot_body(app, prefix, indent, lines, depth)
  local function id(n)
    if n == START then return prefix .. "__start__" end
    if n == END then return prefix .. "__end__" end
    return prefix .. n
  end
  local entry, exit = {}, {}      -- subgraph node -> its START / END id
  lines[#lines + 1] = indent .. dot_q(id(START)) .. (prefix == "" and ' [label="START", shape=oval];'
    or ' [label="", shape=circle, width=0.15, style=filled, fillcolor=black];')
  for _, n in ipairs(app.order) do
    local spec = app.nodes[n]
    if spec.sub and depth > 0 then
      local inner = prefix .. n .. "/"
      lines[#lines + 1] = indent .. "subgraph " .. dot_q("cluster_" .. prefix .. n) .. " {"
      lines[#lines + 1] = indent .. "  label=" .. dot_q(n) .. "; style=rounded;"
      dot_body(spec.sub, inner, indent .. "  ", lines, depth - 1)
      lines[#lines + 1] = indent .. "}"
      entry[n], exit[n] = inner .. "__start__", inner .. "__end__"
    else
      lines[#lines + 1] = indent .. dot_q(id(n)) .. " [label=" .. dot_q(n) ..
        (spec.sub and ", shape=box, peripheries=2];" or ", shape=box];")
    end
  end
  lines[#lines + 1] = indent .. dot_q(id(END)) .. (prefix == "" and ' [label="END", shape=oval];'
    or ' [label="", shape=doublecircle, width=0.1, style=filled, fillcolor=black];')
  for _, e in ipairs(edges_of(app)) do
    local from = exit[e.from] or id(e.from)
    local to = entry[e.to] or id(e.to)
    lines[#lines + 1] = indent .. dot_q(from) .. " -> " .. dot_q(to) .. dot_attrs(e) .. ";"
  end
end

--[[ dot(app [, {depth =}]) -> Graphviz source. Subgraphs are drawn inside
their node as clusters, depth levels deep (default: all; 0 draws them as
boxes). ]]
function _M.dot(app, opts)
  local depth = opts and opts.depth or math.huge
  local lines = { "digraph " .. dot_q(app.name or "graph") .. " {", "  rankdir=TB; compound=true;",
    '  graph [fontname="Noto Sans CJK KR,Noto Sans,sans-serif"];',
    '  node [fontname="Noto Sans CJK KR,Noto Sans,sans-serif"];',
    '  edge [fontname="Noto Sans CJK KR,Noto Sans,sans-serif", fontsize=10];' }
  dot_body(app, "", "  ", lines, depth)
  lines[#lines + 1] = "}"
  return table_concat(lines, "\n") .. "\n"
end

local FORMATS = { svg = true, png = true, pdf = true }

--[[ image(app, format [, {depth =, timeout =}]) -> bytes | nil, err: the
drawing rendered by Graphviz's `dot` (svg, png or pdf), run as a child
process on the loop (the calling task waits, others go on). ]]
function _M.image(app, format, opts)
  if not FORMATS[format] then
    error("bad argument #2 to 'image': format must be svg, png or pdf, got " .. tostring(format), 2)
  end
  local process = require "moongraph.process"
  local r, err = process.run({ "dot", "-T" .. format }, {
    input = _M.dot(app, opts), timeout = opts and opts.timeout or 30 })
  if not r then
    if errors.has(err, "not_found") then
      return nil, "drawing needs Graphviz's dot program (Debian package graphviz): " .. tostring(err)
    end
    return nil, "dot: " .. tostring(err)
  end
  if r.code ~= 0 then
    return nil, "dot failed (exit " .. tostring(r.code or r.signal) .. "): " .. (r.stderr or "")
  end
  return r.stdout
end

return _M
