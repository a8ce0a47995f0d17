-- lgserve.lua — a real `moongraph serve` process for the LangGraph API
-- specs, the official SDK client against it, and curl.
--
--   local lgserve = require "lgserve"
--   local s = lgserve.start{ env = "MOONGRAPH_API_KEYS=..." }  -- serves spec/fixtures/lgapi_agent.lua as "agent"
--                                                              (no rate limit: one client makes many calls)
--   lgserve.start{ args = { "--redis", URL, "--pg", URL } }  -- more arguments for serve (the distributed backend)
--   s.url  s.pid  s.data
--   s:sdk("threads" [, key [, other_key [, other_server]]]) -> what spec/support/node/langgraph_client.mjs printed (decoded)
--   s:curl{ "-X", "POST", "/threads", "-d", "{}" } -> {status, body, json, headers}
--   s:stop()    -- raises if the process had died on the way
local cjson = require "cjson"
local cli = require "cli"
local tmp = require "tmp"

local _M = {}
local S = {}
S.__index = S

local quote = cli.quote
local SDK = "spec/support/node/langgraph_client.mjs"

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return "" end
  local s = f:read("a")
  f:close()
  return s
end

function _M.start(opts)
  opts = opts or {}
  local data = tmp.dir("lgserve", "file")
  local errfile = data .. "/stderr"
  local extra = ""
  for _, a in ipairs(opts.args or {}) do extra = extra .. " " .. quote(a) end
  local cmd = string.format("sh -c %s 2>%s",
    quote(string.format("echo $$; exec env %s%s serve --script agent=spec/fixtures/lgapi_agent.lua --port 0 --rate-limit 0 --data %s%s",
      opts.env and (opts.env .. " ") or "", cli.bin, quote(data .. "/state"), extra)), quote(errfile))
  local fh = assert(io.popen(cmd, "r"))
  local pid = tonumber(fh:read("l"))
  local line = fh:read("l")
  local url = (line or ""):match("^listening on (%S+)$")
  if not url then
    fh:close()
    error("moongraph serve did not start: " .. tostring(line) .. "\n" .. slurp(errfile), 2)
  end
  return setmetatable({ url = url, pid = pid, fh = fh, data = data, errfile = errfile }, S)
end

function S:alive()
  local f = io.open("/proc/" .. self.pid .. "/stat")
  if not f then return false end
  local st = f:read("a"):match("^%d+ %b() (%a)")
  f:close()
  return st ~= nil and st ~= "Z"
end

function S:stderr() return slurp(self.errfile) end

function S:stop()
  if not self.fh then return end
  local was_alive = self:alive()
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  self.fh:close()
  self.fh = nil
  local err = self:stderr()
  if not was_alive then error("moongraph serve had died before stop():\n" .. err, 2) end
  if err:match("ERROR: AddressSanitizer") or err:match("runtime error:") then
    error("moongraph serve reported a sanitizer error:\n" .. err, 2)
  end
end

-- run one scenario of the SDK script -> its decoded output
-- (second: another serve the scenario may reconnect to, LG_SECOND_URL)
function S:sdk(scenario, key, other, second)
  local f = io.open("spec/support/node/node_modules/@langchain/langgraph-sdk/package.json")
  assert(f, "the LangGraph SDK is not installed: run make test (npm ci in spec/support/node)")
  f:close()
  local args = { "timeout", "120", "node", SDK, self.url, scenario }
  if key then args[#args + 1] = key end
  if other then args[#args + 1] = other end
  for i, a in ipairs(args) do args[i] = quote(a) end
  local env = "env -u LD_PRELOAD " .. (second and ("LG_SECOND_URL=" .. quote(second.url) .. " ") or "")
  local p = assert(io.popen(env .. table.concat(args, " ") .. " 2>&1"))
  local out = p:read("a")
  local ok, _, code = p:close()
  assert(ok, "the SDK scenario " .. scenario .. " failed (exit " .. tostring(code) .. "):\n" .. out ..
    "\nserver stderr:\n" .. self:stderr())
  local last = out:match("([^\n]+)\n*$")
  local v = last and cjson.decode(last)
  assert(type(v) == "table", "the SDK scenario printed no JSON: " .. out)
  return v
end

-- curl against the server: args is curl's arguments; the first that starts
-- with / is a path on the server
function S:curl(args, opts)
  opts = opts or {}
  local hfile, bfile = os.tmpname(), os.tmpname()
  local parts = { "env -u LD_PRELOAD curl -s -S --max-time", tostring(opts.timeout or 30),
    "-D", quote(hfile), "-o", quote(bfile) }
  local done = false
  for _, a in ipairs(args) do
    if not done and a:sub(1, 1) == "/" then a, done = self.url .. a, true end
    parts[#parts + 1] = quote(a)
  end
  local p = assert(io.popen(table.concat(parts, " ") .. " 2>&1"))
  local out = p:read("a")
  p:close()
  local head, body = slurp(hfile), slurp(bfile)
  os.remove(hfile)
  os.remove(bfile)
  local res = { out = out, body = body, headers = {} }
  local last
  for block in (head .. "\r\n"):gmatch("(HTTP/.-\r\n)\r\n") do last = block end
  assert(last, "curl got no response: " .. out)
  res.status = tonumber(last:match("^HTTP/%S+ (%d+)"))
  for name, value in last:gmatch("\n([^:\r\n]+):%s*([^\r\n]*)") do res.headers[name:lower()] = value end
  if (res.headers["content-type"] or ""):find("json") then res.json = cjson.decode(body) end
  return res
end

return _M
