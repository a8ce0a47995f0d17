-- moongraph draw SCRIPT [--format svg|png|pdf|dot|mermaid] [--output FILE] [--depth N]
-- Draws the graph a script builds: SCRIPT is a Lua file that returns a
-- compiled graph, or a module with build{} (the worker's script contract).
-- The drawing goes to stdout (or FILE); svg, png and pdf are rendered by
-- Graphviz's dot, dot and mermaid are the diagram's source. Subgraphs are
-- drawn inside their node (--depth 0: as boxes). Exit status: 0 drawn,
-- 1 the script or Graphviz failed, 2 bad usage.
local cliargs = require "moongraph.args"
local compiled_graph = require "moongraph.compiled_graph"
local text = require "moongraph.text"

local SPEC = {
  name = "draw",
  usage = "usage: moongraph draw SCRIPT [--format svg|png|pdf|dot|mermaid] [--output FILE] [--depth N]",
  help = "Draws the graph SCRIPT builds (a Lua file returning a compiled graph, or a\n" ..
    "module with build{}): svg by default, to stdout unless --output names a file.\n" ..
    "svg, png and pdf need Graphviz (Debian package graphviz).",
  options = { format = "string", output = "string", depth = "integer" },
  positional = { name = "script", label = "SCRIPT", required = true },
}

local FORMATS = { svg = true, png = true, pdf = true, dot = true, mermaid = true }

-- the compiled graph a script file gives
local function graph_of(path)
  local chunk, lerr = loadfile(path)
  if not chunk then return nil, lerr end
  local ok, mod = xpcall(chunk, debug.traceback, path)
  if not ok then return nil, text.error_message(mod) end
  if compiled_graph.is_compiled(mod) then return mod end
  if type(mod) == "table" and type(mod.build) == "function" then
    local bok, app, berr = xpcall(mod.build, debug.traceback, {})
    if not bok then return nil, "build failed: " .. text.error_message(app) end
    if compiled_graph.is_compiled(app) then return app end
    return nil, "build{} returned " .. (app == nil and tostring(berr or "nothing") or type(app)) ..
      ", not a compiled graph"
  end
  if type(mod) == "table" and type(mod.graph) == "table" and compiled_graph.is_compiled(mod.graph) then
    return mod.graph    -- an entrypoint, or a module that keeps its graph
  end
  return nil, "the script returned " .. type(mod) .. "; expected a compiled graph or a module with build{}"
end

return {
  main = function(args)
    local o, err = cliargs.parse(SPEC, args)
    if not o then return cliargs.usage_error(SPEC, err) end
    if o.help then return cliargs.help(SPEC) end
    local format = o.format or (o.output and o.output:match("%.(%a+)$")) or "svg"
    if not FORMATS[format] then
      return cliargs.usage_error(SPEC, "--format must be svg, png, pdf, dot or mermaid")
    end
    if o.depth and o.depth < 0 then return cliargs.usage_error(SPEC, "--depth must be 0 or more") end
    local f = io.open(o.script, "r")
    if not f then
      io.stderr:write("moongraph draw: cannot read ", o.script, "\n")
      return 1
    end
    f:close()
    local app, gerr = graph_of(o.script)
    if not app then
      io.stderr:write("moongraph draw: ", o.script, ": ", gerr, "\n")
      return 1
    end
    local render = require "moongraph.render"
    local opts = { depth = o.depth }
    local out
    if format == "dot" then out = render.dot(app, opts)
    elseif format == "mermaid" then out = render.mermaid(app)
    else
      local rerr
      out, rerr = render.image(app, format, opts)
      if not out then
        io.stderr:write("moongraph draw: ", rerr, "\n")
        return 1
      end
    end
    local sink, oerr = io.stdout, nil
    if o.output then
      sink, oerr = io.open(o.output, "wb")
      if not sink then
        io.stderr:write("moongraph draw: ", oerr, "\n")
        return 1
      end
    end
    local ok, werr = sink:write(out)
    local cok, cerr = true, nil
    if o.output then cok, cerr = sink:close() else cok, cerr = sink:flush() end
    if not ok or not cok then
      io.stderr:write("moongraph draw: cannot write the drawing: ", tostring(werr or cerr), "\n")
      return 1
    end
    return 0
  end,
}
