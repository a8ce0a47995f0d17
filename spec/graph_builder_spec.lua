local G = require "moongraph.graph"
local START, END = G.START, G.END

local function noop() end

local function compile_error(build, opts)
  local g = G.new()
  build(g)
  local ok, err = pcall(g.compile, g, opts)
  assert.is_false(ok, "compile should have failed")
  return err
end

describe("graph builder", function()
  it("compiles a linear graph and exposes its API", function()
    local g = G.new()
    g:add_node("a", noop):add_node("b", noop)
    g:add_edge(START, "a"):add_edge("a", "b"):add_edge("b", END)
    local app = g:compile()
    assert.is_function(app.invoke)
    assert.is_function(app.stream)
    assert.is_function(app.mermaid)
  end)

  it("rejects duplicate node names", function()
    local g = G.new()
    g:add_node("a", noop)
    assert.has_error(function() g:add_node("a", noop) end,
      "bad argument #1 to 'add_node': duplicate node name 'a'")
  end)

  it("rejects reserved and malformed node names", function()
    local g = G.new()
    assert.has_error(function() g:add_node(START, noop) end,
      "bad argument #1 to 'add_node': '__start__' is a reserved name")
    assert.has_error(function() g:add_node(END, noop) end,
      "bad argument #1 to 'add_node': '__end__' is a reserved name")
    assert.has_error(function() g:add_node("a:b", noop) end,
      "bad argument #1 to 'add_node': node name 'a:b' may not contain ':', '|', '/' or '#'")
    assert.has_error(function() g:add_node("", noop) end,
      "bad argument #1 to 'add_node': node name (non-empty string) expected, got an empty string")
    assert.has_error(function() g:add_node("x", 42) end,
      "bad argument #2 to 'add_node': function or compiled graph expected for node 'x', got number")
  end)

  it("rejects unknown node options and bad option values", function()
    local g = G.new()
    assert.has_error(function() g:add_node("a", noop, { retires = 3 }) end,
      "bad argument #3 to 'add_node' ('a'): unknown option 'retires' (expected retry, timeout, policy, defer, cache, destinations, metadata)")
    assert.has_error(function() g:add_node("a", noop, { policy = "ignore" }) end,
      "bad argument #3 to 'add_node' ('a'): unknown policy 'ignore' (expected fail_close, fail_open or {fallback = node})")
    assert.has_error(function() g:add_node("a", noop, { timeout = -1 }) end,
      "bad argument #3 to 'add_node' ('a'): timeout must be a positive number of seconds")
    assert.has_error(function() g:add_node("a", noop, { retry = { max_attempts = 0 } }) end,
      "bad argument #3 to 'add_node' ('a'): retry.max_attempts must be a positive integer")
    assert.has_error(function() g:add_node("a", noop, { retry = { bogus = 1 } }) end,
      "bad argument #3 to 'add_node' ('a'): unknown retry field 'bogus'")
    assert.has_error(function() g:add_node("a", noop, { cache = { ttl = "1h" } }) end,
      "bad argument #3 to 'add_node' ('a'): cache.ttl must be a positive number of seconds")
  end)

  it("names an unknown node in an edge", function()
    local err = compile_error(function(g)
      g:add_node("a", noop)
      g:add_edge(START, "a"):add_edge("a", "nope")
    end)
    assert.matches("edge 'a' %-> 'nope': unknown node 'nope'", err)
  end)

  it("names an unknown node in a join", function()
    local err = compile_error(function(g)
      g:add_node("a", noop):add_node("c", noop)
      g:add_edge(START, "a"):add_edge({ "a", "ghost" }, "c")
    end)
    assert.matches("join edge .*unknown node 'ghost'", err)
  end)

  it("names an unknown node in a path_map, with its label", function()
    local err = compile_error(function(g)
      g:add_node("a", noop):add_node("b", noop)
      g:add_edge(START, "a")
      g:add_conditional_edges("a", function() return "yes" end, { yes = "b", no = "missing" })
    end)
    assert.matches("path_map of the router on 'a': unknown node 'missing' %(label 'no'%)", err)
  end)

  it("requires an entry edge", function()
    local err = compile_error(function(g)
      g:add_node("a", noop)
    end)
    assert.matches("no entry edge", err)
  end)

  it("names a node nobody can reach", function()
    local err = compile_error(function(g)
      g:add_node("a", noop):add_node("island", noop)
      g:add_edge(START, "a")
    end)
    assert.matches("node 'island' is unreachable", err)
  end)

  it("counts fallback targets, Command destinations and path_map-less routers as reachable", function()
    local g = G.new()
    g:add_node("a", noop, { policy = { fallback = "fb" }, destinations = { "jump" } })
    g:add_node("fb", noop):add_node("jump", noop)
    g:add_edge(START, "a")
    assert.has_no_error(function() g:compile() end)

    local g2 = G.new()
    g2:add_node("r", noop):add_node("x", noop):add_node("y", noop)
    g2:add_edge(START, "r")
    g2:add_conditional_edges("r", function() return "x" end)
    assert.has_no_error(function() g2:compile() end)
  end)

  it("a join whose sources cannot all run leaves its target unreachable", function()
    local err = compile_error(function(g)
      g:add_node("a", noop):add_node("b", noop):add_node("c", noop)
      g:add_edge(START, "a"):add_edge({ "a", "b" }, "c")
    end)
    assert.matches("node 'b' is unreachable", err)
  end)

  it("names a missing fallback node and a fallback loop", function()
    local err = compile_error(function(g)
      g:add_node("a", noop, { policy = { fallback = "zz" } })
      g:add_edge(START, "a")
    end)
    assert.matches("node 'a': fallback node 'zz' does not exist", err)
    err = compile_error(function(g)
      g:add_node("a", noop, { policy = { fallback = "b" } })
      g:add_node("b", noop, { policy = { fallback = "a" } })
      g:add_edge(START, "a")
    end)
    assert.matches("fallback chain loops: a %-> b %-> a", err)
  end)

  it("names unknown interrupt_before nodes and unknown compile options", function()
    local err = compile_error(function(g)
      g:add_node("a", noop)
      g:add_edge(START, "a")
    end, { interrupt_before = { "zz" } })
    assert.matches("interrupt_before: unknown node 'zz'", err)
    local g = G.new()
    g:add_node("a", noop)
    g:add_edge(START, "a")
    assert.has_error(function() g:compile { checkpoint = true } end,
      "bad argument #1 to 'compile': unknown option 'checkpoint' (expected checkpointer, store, recursion_limit, interrupt_before, interrupt_after, name, durability)")
    assert.has_error(function() g:compile { recursion_limit = 0 } end,
      "bad argument #1 to 'compile': recursion_limit must be a positive integer")
    assert.has_error(function() g:compile { checkpointer = {} } end,
      "bad argument #1 to 'compile': checkpointer lacks method 'put'")
  end)

  it("rejects edges into START and out of END", function()
    local g = G.new()
    assert.has_error(function() g:add_edge("a", START) end,
      "bad argument #2 to 'add_edge': START cannot be the target of an edge")
    assert.has_error(function() g:add_edge(END, "a") end,
      "bad argument #1 to 'add_edge': END cannot be the source of an edge")
  end)

  it("rejects a schema with an unknown reducer name or a non-function reducer", function()
    assert.has_error(function() G.new { x = "sum" } end,
      "bad argument #1 to 'graph': key 'x' names unknown reducer 'sum' (known: last, append, merge, add, messages)")
    assert.has_error(function() G.new { x = 42 } end,
      "bad argument #1 to 'graph': reducer of key 'x' must be a function, got number")
    assert.has_no_error(function() G.new { "plain", items = "append", n = G.reducers.add } end)
  end)
end)

describe("graph rendering", function()
  local function sample()
    local g = G.new()
    g:add_node("classify", noop)
    g:add_node("rag", noop, { policy = { fallback = "search" } })
    g:add_node("search", noop)
    g:add_node("answer", noop)
    g:add_edge(START, "classify")
    g:add_conditional_edges("classify", function() return "docs" end,
      { docs = "rag", web = "search", done = END })
    g:add_edge({ "rag", "search" }, "answer")
    g:add_edge("answer", END)
    return g:compile { name = "demo" }
  end

  it("mermaid draws conditional edges dashed with their path_map labels", function()
    local m = sample():mermaid()
    assert.matches("^flowchart TD\n", m)
    assert.truthy(m:find('n_classify -.->|"docs"| n_rag', 1, true))
    assert.truthy(m:find('n_classify -.->|"web"| n_search', 1, true))
    assert.truthy(m:find('n_classify -.->|"done"| __end__', 1, true))
    assert.truthy(m:find("__start__ --> n_classify", 1, true))
    assert.truthy(m:find('n_rag -->|"join"| n_answer', 1, true))
    assert.truthy(m:find('n_rag -.->|"fallback"| n_search', 1, true))
    assert.truthy(m:find("n_answer --> __end__", 1, true))
  end)

  it("dot draws conditional edges dashed with labels", function()
    local d = sample():dot()
    assert.matches('^digraph "demo" {', d)
    assert.truthy(d:find('"classify" -> "rag" [style=dashed, label="docs"];', 1, true))
    assert.truthy(d:find('"__start__" -> "classify";', 1, true))
    assert.truthy(d:find('"rag" -> "search" [style=dotted, label="fallback"];', 1, true))
  end)

  it("a router without path_map may go to every node", function()
    local g = G.new()
    g:add_node("r", noop):add_node("x", noop)
    g:add_edge(START, "r")
    g:add_conditional_edges("r", function() return "x" end)
    local m = g:compile():mermaid()
    assert.truthy(m:find("n_r -.-> n_x", 1, true))
    assert.truthy(m:find("n_r -.-> __end__", 1, true))
  end)

  it("draws subgraph nodes as subroutines", function()
    local sg = G.new()
    sg:add_node("inner", noop)
    sg:add_edge(START, "inner")
    local g = G.new()
    g:add_node("sub", sg:compile())
    g:add_edge(START, "sub")
    assert.truthy(g:compile():mermaid():find('n_sub[["sub"]]', 1, true))
  end)
end)
