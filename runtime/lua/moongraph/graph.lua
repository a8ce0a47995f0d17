--[[
moongraph.graph — the StateGraph builder and its compiler.

  local G = require "moongraph.graph"
  local g = G.new{ items = G.reducers.append }      -- schema: key -> reducer
  g:add_node("a", function(state, ctx) return { items = "x" } end)
  g:add_edge(G.START, "a")
  local app = g:compile{ checkpointer = G.checkpoint.memory() }

The builder records nodes and edges; compile() checks the whole definition
(every problem is reported by name) and returns a compiled graph
(moongraph.compiled_graph). Execution lives in moongraph.engine.*
(docs/architecture.md has the map).

This module is the public face re-exported by `moongraph` as mg.graph,
mg.START, mg.END, mg.Send, mg.Command, mg.reducers and mg.checkpoint.
]]

local type, pairs, ipairs, error, tostring, setmetatable, getmetatable =
  type, pairs, ipairs, error, tostring, setmetatable, getmetatable
local string_find, table_concat, table_sort = string.find, table.concat, table.sort

local control = require "moongraph.control"
local reducers = require "moongraph.reducers"
local compiled_graph = require "moongraph.compiled_graph"

local START, END = control.START, control.END

local _M = {}
_M.START = START
_M.END = END
_M.Send = control.Send
_M.Command = control.Command
_M.Overwrite = control.Overwrite
_M.PARENT = control.PARENT

--[[ interrupt(value) -> the resume value: ctx.interrupt of the node the
calling task is running, spelled as LangGraph's interrupt(). ]]
function _M.interrupt(value)
  local ctx = require("moongraph.engine.context").current()
  if not ctx then
    error("interrupt: not inside a graph node (call it from the node's own task, or use ctx.interrupt)", 2)
  end
  return ctx.interrupt(value)
end
_M.reducers = reducers

-- mg.checkpoint is loaded on first use: the file saver needs the C store.
setmetatable(_M, { __index = function(t, k)
  if k == "checkpoint" then
    local c = require "moongraph.checkpoint"
    rawset(t, k, c)
    return c
  end
end })

local builder = {}
local builder_mt = { __index = builder, __name = "moongraph.StateGraph" }

local function is_callable(v)
  if type(v) == "function" then return true end
  local mt = getmetatable(v)
  return type(mt) == "table" and mt.__call ~= nil
end

-- Can fn see the second argument (ctx)? A Lua function declaring fewer
-- than two parameters and no `...` cannot; anything else (a C function, a
-- callable table) is assumed to.
local function takes_ctx(fn)
  if type(fn) ~= "function" then return true end
  local info = debug.getinfo(fn, "u")
  return info.nparams >= 2 or info.isvararg
end

local function quote_list(list)
  local out = {}
  for i, v in ipairs(list) do out[i] = "'" .. tostring(v) .. "'" end
  return table_concat(out, ", ")
end

local function parse_schema(schema)
  local reds, declared = {}, {}
  if schema == nil then
    return reds, nil
  end
  if type(schema) ~= "table" then
    error("bad argument #1 to 'graph': schema table expected, got " .. type(schema), 3)
  end
  for k, v in pairs(schema) do
    if type(k) == "number" then
      if type(v) ~= "string" then
        error("bad argument #1 to 'graph': list entry " .. k ..
          " must be a state key name, got " .. type(v), 3)
      end
      declared[v] = true
    elseif type(k) ~= "string" then
      error("bad argument #1 to 'graph': state keys must be strings, got " .. type(k), 3)
    else
      local r = v
      if v == true then
        r = reducers.last
      elseif type(v) == "string" then
        r = reducers.by_name[v]
        if not r then
          error("bad argument #1 to 'graph': key '" .. k .. "' names unknown reducer '" ..
            v .. "' (known: last, append, merge, add, messages)", 3)
        end
      elseif not is_callable(v) then
        error("bad argument #1 to 'graph': reducer of key '" .. k ..
          "' must be a function, got " .. type(v), 3)
      end
      if r ~= reducers.last then reds[k] = r end
      declared[k] = true
    end
  end
  return reds, declared
end

-- A set of key names from a list of names or a schema table.
local function key_set(v, what)
  if type(v) ~= "table" then
    error("bad argument #2 to 'graph': " .. what .. " must be a list of state keys or a schema table", 3)
  end
  local set, any = {}, false
  for k, x in pairs(v) do
    local name = type(k) == "number" and x or k
    if type(name) ~= "string" then
      error("bad argument #2 to 'graph': " .. what .. " holds a " .. type(name) .. "; state keys are strings", 3)
    end
    set[name] = true
    any = true
  end
  if not any then error("bad argument #2 to 'graph': " .. what .. " is empty", 3) end
  return set
end

--[[ new(schema [, {input =, output =}]) -> builder
schema maps state keys to reducers (functions or the names "last", "append",
"merge", "add", "messages"); list entries declare `last` keys by name. Keys
not in the schema are accepted and use `last`. The built-in key `errors`
(append) collects the failures of fail_open nodes.
input and output (lists of keys, or schema tables) are LangGraph's input
and output schemas: invoke and stream take only the input keys of their
input (others are ignored) and give back only the output keys (`values`
events and the result); the other keys are the graph's private state. ]]
function _M.new(schema, opts)
  local reds, declared = parse_schema(schema)
  if reds.errors == nil then reds.errors = reducers.append end
  if declared then declared.errors = true end
  local input_keys, output_keys = nil, nil
  if opts ~= nil then
    if type(opts) ~= "table" then
      error("bad argument #2 to 'graph': options table {input =, output =} expected, got " .. type(opts), 2)
    end
    for k in pairs(opts) do
      if k ~= "input" and k ~= "output" then
        error("bad argument #2 to 'graph': unknown option '" .. tostring(k) .. "' (expected input, output)", 2)
      end
    end
    if opts.input ~= nil then input_keys = key_set(opts.input, "input") end
    if opts.output ~= nil then output_keys = key_set(opts.output, "output") end
  end
  return setmetatable({
    _reducers = reds,
    _declared = declared,     -- nil: every key counts as declared
    _input = input_keys,
    _output = output_keys,
    _nodes = {},
    _order = {},
    _edges = {},
    _joins = {},
    _branches = {},
  }, builder_mt)
end
_M.graph = _M.new

local RESERVED = { [START] = true, [END] = true, __command__ = true, __breakpoint__ = true }

local policy_names = { fail_close = true, fail_open = true }
local retry_fields = {
  max_attempts = "number", initial_interval = "number", backoff_factor = "number",
  max_interval = "number", jitter = "boolean", retry_on = "function",
}

local function check_opts(name, opts)
  local o = { policy = "fail_close" }
  if opts == nil then return o end
  if type(opts) ~= "table" then
    error("bad argument #3 to 'add_node': options table expected, got " .. type(opts), 3)
  end
  local where = "bad argument #3 to 'add_node' ('" .. name .. "'): "
  for k, v in pairs(opts) do
    if k == "retry" then
      if v == true then v = {} end
      if type(v) ~= "table" then error(where .. "retry must be a table", 3) end
      for rk, rv in pairs(v) do
        local want = retry_fields[rk]
        if not want then error(where .. "unknown retry field '" .. tostring(rk) .. "'", 3) end
        if (want == "function" and not is_callable(rv)) or (want ~= "function" and type(rv) ~= want) then
          error(where .. "retry." .. rk .. " must be a " .. want, 3)
        end
      end
      local r = {
        max_attempts = v.max_attempts or 3,
        initial_interval = v.initial_interval or 0.5,
        backoff_factor = v.backoff_factor or 2,
        max_interval = v.max_interval or 128,
        jitter = v.jitter ~= false,
        retry_on = v.retry_on,
      }
      if r.max_attempts < 1 or r.max_attempts % 1 ~= 0 then
        error(where .. "retry.max_attempts must be a positive integer", 3)
      end
      if r.initial_interval < 0 or r.max_interval < 0 or r.backoff_factor < 1 then
        error(where .. "retry intervals must be >= 0 and backoff_factor >= 1", 3)
      end
      o.retry = r
    elseif k == "timeout" then
      if type(v) ~= "number" or v <= 0 then
        error(where .. "timeout must be a positive number of seconds", 3)
      end
      o.timeout = v
    elseif k == "policy" then
      if type(v) == "string" then
        if not policy_names[v] then
          error(where .. "unknown policy '" .. v .. "' (expected fail_close, fail_open or {fallback = node})", 3)
        end
        o.policy = v
      elseif type(v) == "table" and type(v.fallback) == "string" then
        o.policy = "fallback"
        o.fallback = v.fallback
      else
        error(where .. "policy must be \"fail_close\", \"fail_open\" or {fallback = \"node\"}", 3)
      end
    elseif k == "defer" then
      if type(v) ~= "boolean" then error(where .. "defer must be a boolean", 3) end
      o.defer = v
    elseif k == "cache" then
      if v == true then v = {} end
      if type(v) ~= "table" then error(where .. "cache must be a table {ttl=, key=}", 3) end
      if v.ttl ~= nil and (type(v.ttl) ~= "number" or v.ttl <= 0) then
        error(where .. "cache.ttl must be a positive number of seconds", 3)
      end
      if v.key ~= nil and not is_callable(v.key) then
        error(where .. "cache.key must be a function(input) -> string", 3)
      end
      o.cache = { ttl = v.ttl, key = v.key }
    elseif k == "destinations" then
      if type(v) ~= "table" then error(where .. "destinations must be a list of node names", 3) end
      o.destinations = v
    elseif k == "metadata" then
      o.metadata = v
    else
      error(where .. "unknown option '" .. tostring(k) ..
        "' (expected retry, timeout, policy, defer, cache, destinations, metadata)", 3)
    end
  end
  return o
end

--[[ add_node(name, fn_or_compiled_graph [, opts]) -> self
fn(state, ctx) returns a table of updates, nil, or mg.Command{...}. A
compiled graph runs as a subgraph. opts: retry, timeout, policy, defer, cache,
destinations (nodes a Command may jump to), metadata. ]]
function builder:add_node(name, fn, opts)
  if type(name) ~= "string" or name == "" then
    error("bad argument #1 to 'add_node': node name (non-empty string) expected, got " ..
      (name == "" and "an empty string" or type(name)), 2)
  end
  if RESERVED[name] then
    error("bad argument #1 to 'add_node': '" .. name .. "' is a reserved name", 2)
  end
  if string_find(name, "[:|/#]") then
    error("bad argument #1 to 'add_node': node name '" .. name ..
      "' may not contain ':', '|', '/' or '#'", 2)
  end
  if self._nodes[name] then
    error("bad argument #1 to 'add_node': duplicate node name '" .. name .. "'", 2)
  end
  local sub = compiled_graph.is_compiled(fn) and fn or nil
  if not sub and not is_callable(fn) then
    error("bad argument #2 to 'add_node': function or compiled graph expected for node '" ..
      name .. "', got " .. type(fn), 2)
  end
  local spec = check_opts(name, opts)
  spec.name = name
  spec.fn = fn
  spec.sub = sub
  self._nodes[name] = spec
  self._order[#self._order + 1] = name
  return self
end

--[[ add_edge(a, b) -> self ; add_edge({a1, a2, ...}, b) waits for all of
a1, a2, ... before running b. ]]
function builder:add_edge(from, to)
  if type(to) ~= "string" then
    error("bad argument #2 to 'add_edge': node name expected, got " .. type(to), 2)
  end
  if to == START then
    error("bad argument #2 to 'add_edge': START cannot be the target of an edge", 2)
  end
  if type(from) == "table" then
    if #from == 0 then
      error("bad argument #1 to 'add_edge': empty list of source nodes", 2)
    end
    local sources = {}
    for i, s in ipairs(from) do
      if type(s) ~= "string" then
        error("bad argument #1 to 'add_edge': source " .. i .. " is not a node name", 2)
      end
      if s == START or s == END then
        error("bad argument #1 to 'add_edge': START/END cannot be part of a join", 2)
      end
      sources[i] = s
    end
    if #sources == 1 then
      from = sources[1]
    else
      table_sort(sources)
      self._joins[#self._joins + 1] = { sources = sources, target = to }
      return self
    end
  end
  if type(from) ~= "string" then
    error("bad argument #1 to 'add_edge': node name or list of node names expected, got " ..
      type(from), 2)
  end
  if from == END then
    error("bad argument #1 to 'add_edge': END cannot be the source of an edge", 2)
  end
  self._edges[#self._edges + 1] = { from = from, to = to }
  return self
end

--[[ add_conditional_edges(source, router [, path_map]) -> self
router(state, ctx) returns a label (or node name), a list of them, mg.Send
packets or mg.END. path_map maps labels to nodes ({yes = "a"}) or lists the
possible nodes ({"a", "b"}); without it the router may return any node. ]]
function builder:add_conditional_edges(source, router, path_map)
  if type(source) ~= "string" or source == END then
    error("bad argument #1 to 'add_conditional_edges': source node name expected", 2)
  end
  if not is_callable(router) then
    error("bad argument #2 to 'add_conditional_edges': router function expected, got " ..
      type(router), 2)
  end
  local map, labels = nil, nil
  if path_map ~= nil then
    if type(path_map) ~= "table" then
      error("bad argument #3 to 'add_conditional_edges': path_map table expected, got " ..
        type(path_map), 2)
    end
    map, labels = {}, {}
    for k, v in pairs(path_map) do
      if type(v) ~= "string" then
        error("bad argument #3 to 'add_conditional_edges': path_map entry '" ..
          tostring(k) .. "' must be a node name", 2)
      end
      if type(k) == "number" then
        map[v] = v
      elseif type(k) == "string" then
        map[k] = v
      else
        error("bad argument #3 to 'add_conditional_edges': path_map labels must be strings", 2)
      end
    end
    for k in pairs(map) do labels[#labels + 1] = k end
    table_sort(labels)
  end
  self._branches[#self._branches + 1] = {
    source = source, router = router, map = map, labels = labels,
    index = #self._branches + 1,
  }
  return self
end

--[[ add_sequence(list) -> self
Nodes that run one after the other: each entry is {name, fn [, opts]} or a
node table {name = ..., run = fn, policy =, timeout =, ...} (the shape of
nodes/*.lua); an edge joins each to the next. ]]
function builder:add_sequence(list)
  if type(list) ~= "table" or #list == 0 then
    error("bad argument #1 to 'add_sequence': non-empty list of nodes expected", 2)
  end
  local names = {}
  for i, e in ipairs(list) do
    if type(e) ~= "table" then
      error("bad argument #1 to 'add_sequence': entry " .. i .. " must be {name, fn} or {name =, run =}", 2)
    end
    local name, fn, opts
    if e[1] ~= nil then
      name, fn, opts = e[1], e[2], e[3]
    else
      name, fn = e.name, e.run
      opts = {}
      for _, k in ipairs { "retry", "timeout", "policy", "defer", "cache", "destinations", "metadata" } do
        opts[k] = e[k]
      end
    end
    if type(name) ~= "string" then
      error("bad argument #1 to 'add_sequence': entry " .. i .. " has no name", 2)
    end
    self:add_node(name, fn, opts)
    names[i] = name
  end
  for i = 2, #names do self:add_edge(names[i - 1], names[i]) end
  return self
end

function builder:set_entry_point(name) return self:add_edge(START, name) end
function builder:set_finish_point(name) return self:add_edge(name, END) end

local function fail(msg)
  error("compile: " .. msg, 3)
end

local function check_node_ref(self, name, what)
  if name ~= END and not self._nodes[name] then
    fail(what .. ": unknown node '" .. tostring(name) .. "'")
  end
end

--[[ Which nodes can run at all: from START follow edges, joins (once all
their sources can run), every target a router may return, Command
destinations and fallback nodes. ]]
local function reachable(self)
  local seen = {}
  local changed = true
  local function mark(n)
    if n ~= END and n ~= START and not seen[n] then
      seen[n] = true
      changed = true
    end
  end
  local function live(n) return n == START or seen[n] end
  while changed do
    changed = false
    for _, e in ipairs(self._edges) do
      if live(e.from) then mark(e.to) end
    end
    for _, j in ipairs(self._joins) do
      local all = true
      for _, s in ipairs(j.sources) do
        if not seen[s] then all = false break end
      end
      if all then mark(j.target) end
    end
    for _, b in ipairs(self._branches) do
      if live(b.source) then
        if b.map then
          for _, target in pairs(b.map) do mark(target) end
        else
          for _, n in ipairs(self._order) do mark(n) end
        end
      end
    end
    for _, n in ipairs(self._order) do
      if seen[n] then
        local spec = self._nodes[n]
        if spec.fallback then mark(spec.fallback) end
        if spec.destinations then
          for _, d in ipairs(spec.destinations) do mark(d) end
        end
      end
    end
  end
  return seen
end

local compile_fields = {
  checkpointer = true, recursion_limit = true, interrupt_before = true,
  interrupt_after = true, name = true, durability = true, store = true,
}

local function node_set(self, list, what)
  if list == nil then return nil end
  if list == "*" then return "*" end
  if type(list) == "string" then list = { list } end
  if type(list) ~= "table" then
    error("bad argument #1 to 'compile': " .. what .. " must be a list of node names or \"*\"", 3)
  end
  local set = {}
  for _, n in ipairs(list) do
    if not self._nodes[n] then fail(what .. ": unknown node '" .. tostring(n) .. "'") end
    set[n] = true
  end
  return set
end

--[[ compile{checkpointer, store, recursion_limit, interrupt_before,
interrupt_after, name, durability} -> compiled graph. Raises naming the first
problem found. store: the long-term store nodes see as ctx.store. ]]
function builder:compile(opts)
  opts = opts or {}
  if type(opts) ~= "table" then
    error("bad argument #1 to 'compile': options table expected, got " .. type(opts), 2)
  end
  for k in pairs(opts) do
    if not compile_fields[k] then
      error("bad argument #1 to 'compile': unknown option '" .. tostring(k) ..
        "' (expected checkpointer, store, recursion_limit, interrupt_before, interrupt_after, name, durability)", 2)
    end
  end
  local cp = opts.checkpointer
  if cp ~= nil then
    for _, m in ipairs { "put", "put_writes", "get", "list", "delete_thread" } do
      if type(cp) ~= "table" or not is_callable(cp[m]) then
        error("bad argument #1 to 'compile': checkpointer lacks method '" .. m .. "'", 2)
      end
    end
  end
  local limit = opts.recursion_limit or 25
  if type(limit) ~= "number" or limit < 1 or limit % 1 ~= 0 then
    error("bad argument #1 to 'compile': recursion_limit must be a positive integer", 2)
  end
  local durability = opts.durability or "async"
  if durability ~= "sync" and durability ~= "async" and durability ~= "exit" then
    error("bad argument #1 to 'compile': durability must be \"sync\", \"async\" or \"exit\"", 2)
  end
  if #self._order == 0 then fail("the graph has no nodes") end

  -- references
  for _, e in ipairs(self._edges) do
    if e.from ~= START then check_node_ref(self, e.from, "edge '" .. e.from .. "' -> '" .. e.to .. "'") end
    check_node_ref(self, e.to, "edge '" .. e.from .. "' -> '" .. e.to .. "'")
  end
  for _, j in ipairs(self._joins) do
    local what = "join edge {" .. quote_list(j.sources) .. "} -> '" .. j.target .. "'"
    for _, s in ipairs(j.sources) do check_node_ref(self, s, what) end
    check_node_ref(self, j.target, what)
  end
  for _, b in ipairs(self._branches) do
    if b.source ~= START then
      check_node_ref(self, b.source, "conditional edges from '" .. b.source .. "'")
    end
    if b.map then
      for _, label in ipairs(b.labels) do
        local target = b.map[label]
        if target ~= END and not self._nodes[target] then
          fail("path_map of the router on '" .. b.source .. "': unknown node '" ..
            target .. "'" .. (label ~= target and (" (label '" .. label .. "')") or ""))
        end
      end
    end
  end
  for _, n in ipairs(self._order) do
    local spec = self._nodes[n]
    if spec.fallback then
      if not self._nodes[spec.fallback] then
        fail("node '" .. n .. "': fallback node '" .. spec.fallback .. "' does not exist")
      end
      local chain, at = { n }, spec.fallback
      local visited = { [n] = true }
      while at do
        chain[#chain + 1] = at
        if visited[at] then
          fail("fallback chain loops: " .. table_concat(chain, " -> "))
        end
        visited[at] = true
        at = self._nodes[at].fallback
      end
    end
    if spec.destinations then
      for _, d in ipairs(spec.destinations) do
        if d ~= END and not self._nodes[d] then
          fail("node '" .. n .. "': destination '" .. tostring(d) .. "' does not exist")
        end
      end
    end
  end

  -- entry
  local has_entry = false
  for _, e in ipairs(self._edges) do
    if e.from == START then has_entry = true end
  end
  for _, b in ipairs(self._branches) do
    if b.source == START then has_entry = true end
  end
  if not has_entry then
    fail("no entry edge: add g:add_edge(mg.START, \"<first node>\") or conditional edges from mg.START")
  end

  -- reachability
  local seen = reachable(self)
  for _, n in ipairs(self._order) do
    if not seen[n] then
      fail("node '" .. n .. "' is unreachable: no edge, path_map, fallback or destinations leads to it from START")
    end
  end

  local ib = node_set(self, opts.interrupt_before, "interrupt_before")
  local ia = node_set(self, opts.interrupt_after, "interrupt_after")

  -- runtime form: per-node outgoing edges, joins and routers
  local nodes = {}
  for _, n in ipairs(self._order) do
    local s = self._nodes[n]
    nodes[n] = {
      name = n, fn = s.fn, sub = s.sub, retry = s.retry, timeout = s.timeout,
      policy = s.policy, fallback = s.fallback, defer = s.defer, cache = s.cache,
      destinations = s.destinations, metadata = s.metadata,
      edges = {}, joins = {}, branches = {},
      -- no option to apply: the runner calls fn directly
      plain = not s.sub and not s.retry and not s.timeout and not s.cache and s.policy == "fail_close",
      -- fn cannot see its ctx: a plain run need not make one
      no_ctx = not s.sub and not takes_ctx(s.fn),
    }
  end
  -- Can any node or router read ctx.previous_tasks? If none can, a run
  -- without saver, stream or trace keeps no task records (and times nothing).
  local records_seen = false
  for _, n in ipairs(self._order) do
    if not nodes[n].no_ctx then records_seen = true end
  end
  for _, b in ipairs(self._branches) do
    if takes_ctx(b.router) then records_seen = true end
  end
  local start = { name = START, edges = {}, joins = {}, branches = {} }
  local function src(name) return name == START and start or nodes[name] end
  for _, e in ipairs(self._edges) do
    local list = src(e.from).edges
    local dup = false
    for _, t in ipairs(list) do if t == e.to then dup = true end end
    if not dup then list[#list + 1] = e.to end
  end
  for _, j in ipairs(self._joins) do
    local join = {
      key = table_concat(j.sources, ",") .. ">" .. j.target,
      sources = j.sources, target = j.target,
    }
    for _, s in ipairs(j.sources) do
      local js = nodes[s].joins
      js[#js + 1] = join
    end
  end
  for _, b in ipairs(self._branches) do
    local list = src(b.source).branches
    list[#list + 1] = b
  end
  local has_joins = #self._joins > 0

  return compiled_graph.new {
    name = opts.name or "graph",
    nodes = nodes,
    order = self._order,
    start = start,
    reducers = self._reducers,
    declared = self._declared,
    checkpointer = cp,
    store = opts.store,
    recursion_limit = limit,
    durability = durability,
    interrupt_before = ib,
    interrupt_after = ia,
    has_joins = has_joins,
    records_seen = records_seen,
    input_keys = self._input,
    output_keys = self._output,
    -- kept for rendering
    edges = self._edges,
    joins = self._joins,
    branches = self._branches,
  }
end

return _M
