-- A graph picture a person can look at: dot with subgraphs drawn inside
-- their node, rendered by Graphviz (as LangGraph's draw_png / draw_mermaid:
-- https://docs.langchain.com/oss/python/langgraph/use-graph-api#visualize-your-graph).
local mg = require "moongraph"
local G = require "moongraph.graph"
local cli = require "cli"
local tmp = require "tmp"
local START, END = G.START, G.END

local function noop() end

local function nested()
  local c = G.new()
  c:add_node("x", noop):add_node("y", noop)
  c:add_edge(START, "x")
  c:add_conditional_edges("x", function() return "go" end, { go = "y", stop = END })
  local g = G.new()
  g:add_node("a", noop):add_node("sub", c:compile { name = "child" }):add_node("b", noop)
  g:add_edge(START, "a"):add_edge("a", "sub"):add_edge("sub", "b")
  return g:compile { name = "outer" }
end

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

describe("drawing a graph", function()
  it("dot draws a subgraph inside its node, with its conditional edges", function()
    local d = nested():dot()
    assert.truthy(d:find('subgraph "cluster_sub" {', 1, true))
    assert.truthy(d:find('"a" -> "sub/__start__";', 1, true))
    assert.truthy(d:find('"sub/__end__" -> "b";', 1, true))
    assert.truthy(d:find('"sub/x" -> "sub/y" [style=dashed, label="go"];', 1, true))
    assert.truthy(d:find('"sub/x" -> "sub/__end__" [style=dashed, label="stop"];', 1, true))
  end)

  it("depth 0 draws a subgraph as one box", function()
    local d = nested():dot { depth = 0 }
    assert.is_nil(d:find("cluster_", 1, true))
    assert.truthy(d:find('"sub" [label="sub", shape=box, peripheries=2];', 1, true))
    assert.truthy(d:find('"a" -> "sub";', 1, true))
  end)

  it("draw_png writes a PNG rendered by Graphviz", function()
    local path = tmp.path("g.png", "draw")   -- removed with its directory when the test ends
    local ok, err = mg.run(function() return nested():draw_png(path) end)
    assert.is_true(ok, err)
    local bytes = assert(slurp(path))
    assert.equal("\137PNG\r\n\26\n", bytes:sub(1, 8))
  end)

  it("draw picks svg from the file name; the picture names every node", function()
    local path = tmp.path("g.svg", "draw")
    assert.is_true(mg.run(function() return nested():draw(path) end))
    local svg = assert(slurp(path))
    assert.matches("<svg", svg)
    for _, name in ipairs { "START", "END", ">a<", ">b<", ">x<", ">y<", ">sub<" } do
      assert.truthy(svg:find(name, 1, true), name .. " missing from the svg")
    end
  end)

  it("an unwritable path is an error, not a crash", function()
    local ok, err = mg.run(function() return nested():draw("/nonexistent-dir/g.png") end)
    assert.is_nil(ok)
    assert.matches("nonexistent%-dir", err)
  end)
end)

describe("moongraph draw", function()
  it("writes the svg of a script's graph to stdout", function()
    local r = cli.run { "draw", "scripts/eco/chat.lua" }
    assert.equal(0, r.code, r.err)
    assert.matches("^<%?xml", r.out)
    assert.truthy(r.out:find(">aggregator<", 1, true))
  end)

  it("gives the dot source and png by --format or the output's extension", function()
    local r = cli.run { "draw", "scripts/gcri/graph.lua", "--format", "dot" }
    assert.equal(0, r.code, r.err)
    assert.truthy(r.out:find('subgraph "cluster_hypothesis_executor"', 1, true))
    local path = tmp.path("g.png", "draw")
    r = cli.run { "draw", "scripts/gcri/graph.lua", "--output", path }
    assert.equal(0, r.code, r.err)
    assert.equal("\137PNG", assert(slurp(path)):sub(1, 4))
  end)

  it("bad usage exits 2, a script that builds no graph exits 1, each with a reason", function()
    local r = cli.run { "draw", "scripts/eco/chat.lua", "--format", "jpg" }
    assert.equal(2, r.code)
    assert.matches("%-%-format must be svg, png, pdf, dot or mermaid", r.err)
    r = cli.run { "draw" }
    assert.equal(2, r.code)
    assert.matches("missing SCRIPT", r.err)
    local script = cli.write_temp("return 42\n")
    r = cli.run { "draw", script }
    assert.equal(1, r.code)
    assert.matches("expected a compiled graph or a module with build{}", r.err)
    r = cli.run { "draw", "/nonexistent/x.lua" }
    assert.equal(1, r.code)
    assert.matches("cannot read /nonexistent/x.lua", r.err)
  end)
end)
