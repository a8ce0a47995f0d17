-- moongraph serve [--host H] [--port N] [--script [NAME=]PATH]... [--data DIR]
--                 [--redis URL --pg URL [--prefix P] [--checkpoint KIND]]
--                 [--heartbeat SEC] [--rate-limit N] [--rate-burst N]
--                 [--concurrency N] [--web DIR] [--watchdog SEC]
--                 [--trusted-proxy ADDR[/BITS]]...
--
-- The front door: the Chat API (moongraph.api.chat), the LangGraph Agent
-- API (moongraph.api.langgraph) and the web chat page (web/) at /. On the
-- embedded backend (the default) it runs the scripts in this process, with
-- conversations, job event logs and checkpoints under --data (default
-- .moongraph). With --redis and --pg the Chat API is distributed
-- (moongraph.api.chat_distributed): messages are jobs for `moongraph worker`
-- processes, conversations live in PostgreSQL, and the LangGraph Agent API
-- is distributed too (moongraph.api.langgraph_distributed: the service
-- over PostgreSQL with runs as jobs): threads and runs in PostgreSQL, runs
-- executed by the workers, state read through the workers' saver
-- (--checkpoint, as theirs); the process keeps no state.
-- Without --script it serves the scripts the applications on the module
-- path declare (scripts/APP/serve.lua, moongraph.commands). API keys come from
-- MOONGRAPH_API_KEYS="key=user,..." (or MOONGRAPH_API_KEYS_FILE); without
-- keys it listens on loopback only. A client address that fails to
-- authenticate AUTH_FAILURES times gets 429 for a while (behind a proxy
-- named by --trusted-proxy, the address it forwarded counts). A task that
-- runs --watchdog seconds (default 5) without yielding is stopped
-- (docs/runtime.md#the-watchdog). Prints "listening on URL" once it
-- accepts connections (--port 0 picks a free port) and serves until SIGTERM
-- or SIGINT (then drains). Exit status: 0 after a drain, 1 when it cannot
-- start, 2 on bad usage.
local cliargs = require "moongraph.args"
local config = require "moongraph.worker.config"
local paths = require "moongraph.paths"

local SPEC = {
  name = "serve",
  usage = "usage: moongraph serve [--host H] [--port N] [--script [NAME=]PATH]... [--data DIR]\n" ..
    "                       [--redis URL --pg URL [--prefix P] [--checkpoint KIND]]\n" ..
    "                       [--heartbeat SEC] [--rate-limit N] [--rate-burst N] [--concurrency N] [--web DIR]\n" ..
    "                       [--watchdog SEC] [--trusted-proxy ADDR[/BITS]]...",
  help = "Serves the Chat API (/chat/...), the LangGraph Agent API and the web chat page (/)\n" ..
    "over the scripts given (default: those the applications on the module path declare in\n" ..
    "scripts/APP/serve.lua): runs in-process, state under --data (default .moongraph).\n" ..
    "API keys: MOONGRAPH_API_KEYS=\"key=user,...\" (or MOONGRAPH_API_KEYS_FILE); without\n" ..
    "keys only loopback hosts are allowed. --rate-limit: requests per minute per key\n" ..
    "(default 600; 0: off), --rate-burst: how many may come at once (default 60). A client\n" ..
    "address with 10 failed authentications gets 429 until they age out (10 a minute);\n" ..
    "--trusted-proxy ADDR[/BITS]: a proxy whose X-Forwarded-For names the client.\n" ..
    "--watchdog SEC: a task that runs this long without yielding is stopped (default 5;\n" ..
    "0: never). --redis URL --pg URL: both APIs queue runs for `moongraph worker` processes\n" ..
    "(--prefix and --checkpoint as theirs; default cached) and keep conversations, threads\n" ..
    "and runs in PostgreSQL. See docs/api.md.",
  options = { host = "string", port = "integer", script = "list", data = "string",
              heartbeat = "number", ["rate-limit"] = "number",
              ["rate-burst"] = "integer", concurrency = "integer", web = "string",
              ["max-message"] = "integer", redis = "string", pg = "string", prefix = "string",
              checkpoint = "string", watchdog = "number", ["trusted-proxy"] = "list" },
}

local function loopback(host)
  return host == "127.0.0.1" or host == "localhost" or host == "::1" or host:match("^127%.") ~= nil
end

local function fail(msg, code)
  io.stderr:write("moongraph serve: ", msg, "\n")
  io.stderr:flush()
  return code or 1
end

local function isdir(path)
  local ok = os.rename(path, path)
  return ok and io.open(path .. "/index.html", "r") ~= nil
end

-- The web page's directory: --web, else web/ in the first root that has it.
local function web_dir(o)
  if o.web then return o.web end
  if isdir("web") then return "web" end
  local p = paths.find("web/index.html")
  if p then return (p:gsub("/index%.html$", "")) end
  return nil
end

return {
  main = function(args)
    local o, err = cliargs.parse(SPEC, args)
    if not o then return cliargs.usage_error(SPEC, err) end
    if o.help then return cliargs.help(SPEC) end
    local scripts, seen = {}, {}
    local given = o.script or {}
    if #given == 0 then
      local declared, derr = require("moongraph.commands").served()
      if not declared then return fail(derr, 2) end
      if not declared[1] then
        return cliargs.usage_error(SPEC, "no script to serve: give --script [NAME=]PATH (or put an application " ..
          "that declares scripts/APP/serve.lua on the module path)")
      end
      given = declared
    end
    for _, s in ipairs(given) do
      local spec, serr = config.script_spec(s)
      if not spec then return cliargs.usage_error(SPEC, serr) end
      if seen[spec.name] then return cliargs.usage_error(SPEC, "two scripts named '" .. spec.name .. "' (use NAME=PATH)") end
      seen[spec.name] = true
      scripts[#scripts + 1] = spec
    end
    local host = o.host or "127.0.0.1"
    local port = o.port or 2024
    if port < 0 or port > 65535 then return cliargs.usage_error(SPEC, "--port must be 0..65535") end
    if o.heartbeat and o.heartbeat <= 0 then return cliargs.usage_error(SPEC, "--heartbeat must be > 0 seconds") end
    if o.rate_limit and o.rate_limit < 0 then return cliargs.usage_error(SPEC, "--rate-limit must be >= 0 (0: no limit)") end
    if o.rate_burst and o.rate_burst < 1 then return cliargs.usage_error(SPEC, "--rate-burst must be >= 1") end
    if o.concurrency and o.concurrency < 1 then return cliargs.usage_error(SPEC, "--concurrency must be >= 1") end
    if o.max_message and o.max_message < 1 then return cliargs.usage_error(SPEC, "--max-message must be >= 1 (bytes)") end
    if o.watchdog and not (o.watchdog >= 0 and o.watchdog < 1e9) then
      return cliargs.usage_error(SPEC, "--watchdog must be 0 to 1e9 seconds (0: never)")
    end
    local trusted
    if o.trusted_proxy then
      local perr
      trusted, perr = require("moongraph.api.client_addr").parse_list(table.concat(o.trusted_proxy, ","))
      if not trusted then return cliargs.usage_error(SPEC, "--trusted-proxy: " .. perr) end
    end
    local watchdog = o.watchdog or 5

    local auth = require "moongraph.api.auth"
    local keys, kerr = auth.from_env()
    if kerr then return fail(kerr, 2) end
    if not keys and not loopback(host) then
      return fail("refusing to listen on " .. host .. " without API keys: set MOONGRAPH_API_KEYS=" ..
        "\"key=user,...\" (or MOONGRAPH_API_KEYS_FILE), or listen on 127.0.0.1", 2)
    end
    local llm, lerr = require("moongraph.llm").from_env()
    if lerr then io.stderr:write("moongraph serve: no LLM: ", lerr, "; answering offline\n") end

    local data = o.data or ".moongraph"
    if (o.redis == nil) ~= (o.pg == nil) then
      return cliargs.usage_error(SPEC, "--redis and --pg go together (the distributed backend needs both)")
    end
    if o.checkpoint and not o.redis then
      return cliargs.usage_error(SPEC, "--checkpoint names the workers' saver: it goes with --redis and --pg")
    end
    local backend, berr
    if o.redis then
      backend, berr = require("moongraph.api.chat_distributed").new {
        redis = o.redis, pg = o.pg, prefix = o.prefix, scripts = scripts,
      }
    else
      backend, berr = require("moongraph.api.chat_embedded").new {
        data = data, scripts = scripts, llm = llm, concurrency = o.concurrency,
      }
    end
    if not backend then return fail(berr) end

    local ratelimit = require "moongraph.api.ratelimit"
    local guard = require "moongraph.api.guard"
    local limiter = ratelimit.new { rate = o.rate_limit or 600, burst = o.rate_burst or 60 }
    -- failed authentications per client address, whatever --rate-limit says
    local auth_limiter = ratelimit.new { rate = guard.AUTH_FAILURES_PER_MINUTE, burst = guard.AUTH_FAILURES }
    -- (both APIs: one budget per key or address)
    local access = { keys = keys, limiter = limiter, auth_limiter = auth_limiter, trusted_proxies = trusted,
      heartbeat = o.heartbeat, max_message = o.max_message }
    local routes = require("moongraph.api.chat").routes(backend, access)

    -- The LangGraph Agent API over the same scripts
    local langgraph = require "moongraph.api.langgraph"
    local lb, lgerr
    if o.redis then
      lb, lgerr = require("moongraph.api.langgraph_distributed").new {
        redis = o.redis, pg = o.pg, prefix = o.prefix, scripts = scripts,
        checkpoint = o.checkpoint or os.getenv("MOONGRAPH_CHECKPOINT"),
      }
    else
      lb, lgerr = require("moongraph.api.embedded").new { data = data, scripts = scripts }
    end
    if not lb then return fail("the LangGraph API: " .. tostring(lgerr)) end
    for k, v in pairs(langgraph.routes(lb, access)) do
      if routes[k] == nil then routes[k] = v end
    end

    local server = require "moongraph.server"
    local srv, serr = server.listen {
      host = host, port = port, routes = routes, static = web_dir(o),
      signals = { "TERM", "INT" }, watchdog = watchdog,
      max_body = math.max(1024 * 1024, (o.max_message or 16384) * 2 + 4096),
    }
    if not srv then
      return fail("cannot listen on " .. host .. ":" .. tostring(port) .. ": " .. tostring(serr))
    end
    -- every task of the process from here on (the backends' runs and jobs
    -- too); start-up above may take its time
    require("moongraph").watchdog(watchdog)
    io.stdout:write("listening on ", srv.url, "\n")
    io.stdout:flush()
    srv:wait()
    if backend.close then backend:close() end
    if lb.close then lb:close() end
    return 0
  end,
}
