-- moongraph mcp serve FILE.lua [--http PORT]
-- Serves the tools (and resources and prompts) that FILE.lua declares as an
-- MCP server over stdio (MCP clients start this command and talk JSON-RPC
-- on its stdin/stdout), or with --http PORT over Streamable HTTP at
-- http://HOST:PORT/mcp (HOST 127.0.0.1 unless --host; PORT 0 picks a free
-- one; the URL is printed on stderr once listening). FILE returns {name, version, tools = { {name,
-- description, inputSchema, handler}, ... }} or a module whose `mcp` field
-- is that declaration (or a function making it); see docs/mcp.md.
-- Diagnostics go to stderr; print() in a tool writes to stderr too, since
-- stdout carries the protocol.

local cliargs = require "moongraph.args"

local USAGE = "usage: moongraph mcp serve FILE.lua [--http PORT [--host HOST]]"
local SPEC = {
  name = "mcp serve", usage = USAGE,
  options = { http = "integer", host = "string" },
  positional = { name = "file", label = "FILE", required = true },
}

local function parse(args)
  if args[1] == "-h" or args[1] == "--help" then return { help = true } end
  if args[1] ~= "serve" then
    return nil, args[1] and ("unknown subcommand '" .. args[1] .. "' (serve)") or "missing subcommand (serve)"
  end
  local rest = {}
  for i = 2, #args do rest[#rest + 1] = args[i] end
  local o, err = cliargs.parse(SPEC, rest)
  if not o then return nil, err end
  if o.http and (o.http < 0 or o.http > 65535) then return nil, "--http: port 0..65535 expected" end
  return o
end

local function main(args)
  local o, perr = parse(args)
  if not o then
    io.stderr:write("moongraph mcp: ", perr, "\n", USAGE, "\n")
    return 2
  end
  if o.help then io.stdout:write(USAGE, "\n") return 0 end
  -- stdout carries the protocol: nothing else may write there
  _G.print = function(...)
    local n = select("#", ...)
    local parts = { ... }
    for i = 1, n do parts[i] = tostring(parts[i]) end
    io.stderr:write(table.concat(parts, "\t", 1, n), "\n")
  end
  local server = require "moongraph.mcp.server"
  local s, err = server.load(o.file)
  if not s then
    io.stderr:write("moongraph mcp: ", tostring(err), "\n")
    return 1
  end
  if o.http then
    local http_server = require "moongraph.mcp.http_server"
    local srv, serr = http_server.serve(s, {
      host = o.host or "127.0.0.1", port = o.http,
      on_error = function(msg) io.stderr:write("moongraph mcp: ", msg, "\n") end,
    })
    if not srv then
      io.stderr:write("moongraph mcp: cannot listen: ", tostring(serr), "\n")
      return 1
    end
    io.stderr:write(string.format("moongraph mcp: serving %d tool(s) of %s at %s\n", #s.tool_list, o.file, srv.url))
    io.stderr:flush()
    srv:wait()      -- until SIGTERM/SIGINT drains the server
    return 0
  end
  io.stderr:write(string.format("moongraph mcp: serving %d tool(s) of %s over stdio\n", #s.tool_list, o.file))
  s:serve_stdio {
    on_error = function(msg) io.stderr:write("moongraph mcp: ", msg, "\n") end,
  }
  return 0
end

return { main = main, USAGE = USAGE }
