-- moongraph serve --script [NAME=]PATH... [--host H] [--port N] [--data DIR]
-- Serves the LangGraph Agent API (moongraph.api.langgraph) over the scripts
-- given, on the embedded backend: runs in this process, checkpoints and
-- threads under DIR (default .moongraph). Prints "listening on URL" once it
-- accepts connections (--port 0 picks a free port) and serves until SIGTERM
-- or SIGINT. API keys come from MOONGRAPH_API_KEYS (or _FILE); without keys
-- it listens on loopback only. Exit status: 0 after a drain, 1 when it
-- cannot start, 2 on bad usage.
local cliargs = require "moongraph.args"
local config = require "moongraph.worker.config"

local SPEC = {
  name = "serve",
  usage = "usage: moongraph serve --script [NAME=]PATH... [--host H] [--port N] [--data DIR]",
  help = "Serves the LangGraph Agent API over the scripts given (each is an assistant\n" ..
    "named NAME, default the file's name): runs in-process, threads and checkpoints\n" ..
    "under --data (default .moongraph). Keys: MOONGRAPH_API_KEYS=\"key=user,...\"\n" ..
    "(or MOONGRAPH_API_KEYS_FILE); without keys only loopback hosts are allowed.\n" ..
    "See docs/api.md.",
  options = { host = "string", port = "integer", script = "list", data = "string",
              heartbeat = "number" },
}

local function loopback(host)
  return host == "127.0.0.1" or host == "localhost" or host == "::1" or host:match("^127%.") ~= nil
end

return {
  main = function(args)
    local o, err = cliargs.parse(SPEC, args)
    if not o then return cliargs.usage_error(SPEC, err) end
    if o.help then return cliargs.help(SPEC) end
    local scripts, seen = {}, {}
    for _, s in ipairs(o.script or {}) do
      local spec, serr = config.script_spec(s)
      if not spec then return cliargs.usage_error(SPEC, serr) end
      if seen[spec.name] then return cliargs.usage_error(SPEC, "two scripts named '" .. spec.name .. "' (use NAME=PATH)") end
      seen[spec.name] = true
      scripts[#scripts + 1] = spec
    end
    if #scripts == 0 then return cliargs.usage_error(SPEC, "no script to serve: give --script [NAME=]PATH (repeatable)") end
    local host = o.host or "127.0.0.1"
    local port = o.port or 2024
    if port < 0 or port > 65535 then return cliargs.usage_error(SPEC, "--port must be 0..65535") end
    if o.heartbeat and o.heartbeat <= 0 then return cliargs.usage_error(SPEC, "--heartbeat must be > 0 seconds") end
    local auth = require "moongraph.api.auth"
    local keys, kerr = auth.from_env()
    if kerr then
      io.stderr:write("moongraph serve: ", kerr, "\n")
      return 2
    end
    if not keys and not loopback(host) then
      io.stderr:write("moongraph serve: refusing to listen on ", host, " without API keys: set ",
        "MOONGRAPH_API_KEYS=\"key=user,...\" (or MOONGRAPH_API_KEYS_FILE), or listen on 127.0.0.1\n")
      return 2
    end
    local backend, berr = require("moongraph.api.embedded").new { data = o.data or ".moongraph", scripts = scripts }
    if not backend then
      io.stderr:write("moongraph serve: ", berr, "\n")
      return 1
    end
    local routes = require("moongraph.api.langgraph").routes(backend, { keys = keys, heartbeat = o.heartbeat })
    local server = require "moongraph.server"
    local srv, lerr = server.listen { host = host, port = port, routes = routes, signals = { "TERM", "INT" } }
    if not srv then
      io.stderr:write("moongraph serve: cannot listen on ", host, ":", tostring(port), ": ", tostring(lerr), "\n")
      return 1
    end
    io.stdout:write("listening on ", srv.url, "\n")
    io.stdout:flush()
    srv:wait()
    return 0
  end,
}
