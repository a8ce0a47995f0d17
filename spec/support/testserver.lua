-- testserver.lua — start and drive build/testserver from specs and benchmarks.
--
--   local testserver = require "testserver"
--   local srv = testserver.start()            -- or start{ tls = true }
--   srv.url      "http://127.0.0.1:PORT"  (https://localhost:PORT with tls)
--   srv.ca_file  the self-signed certificate (tls only)
--   srv.stall_url  a port that never completes connections once its
--                  one-slot queue is taken (connect timeouts)
--   srv:stop()
--
-- The control helpers below talk to the server with moongraph.http, so they
-- must run inside a moongraph task (mg.run / a spawned task).

local cjson = require "cjson.safe"
local tmp = require "tmp"

local io, os, string, table = io, os, string, table
local error, tostring, tonumber, ipairs, setmetatable, require =
      error, tostring, tonumber, ipairs, setmetatable, require

local _M = {}
-- Collected or closed without stop(): stop it, so closing the pipe (which
-- waits for the process) cannot hang.
local mt = { __index = _M, __gc = function(self) self:stop() end,
             __close = function(self) self:stop() end }

local BINARY = os.getenv("MOONGRAPH_TESTSERVER") or "build/testserver"

local function sh_quote(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

local function file_exists(path)
  local f = io.open(path, "rb")
  if f then f:close() return true end
  return false
end

-- A self-signed certificate for localhost and 127.0.0.1, made with openssl.
local function make_cert()
  local dir = tmp.dir("cert")
  local cert, key = dir .. "/cert.pem", dir .. "/key.pem"
  local cmd = string.format(
    "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
    .. "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout %s -out %s "
    .. ">/dev/null 2>&1", sh_quote(key), sh_quote(cert))
  if not os.execute(cmd) then
    error("testserver: openssl could not make a self-signed certificate", 3)
  end
  return dir, cert, key
end

-- Start a server on a free port and wait for its "listening" line.
function _M.start(opts)
  opts = opts or {}
  if not file_exists(BINARY) then
    error("testserver: " .. BINARY .. " not found (run `make` first)", 2)
  end
  local args = { "exec", sh_quote(BINARY), "0" }
  local dir, cert, key
  if opts.tls then
    dir, cert, key = make_cert()
    args[#args + 1] = "--tls " .. sh_quote(cert) .. " " .. sh_quote(key)
  end
  local fh = assert(io.popen(table.concat(args, " "), "r"))
  local line = fh:read("l")
  local scheme, port, pid, stall =
    (line or ""):match("listening on (%a+)://[^:]+:(%d+) pid (%d+) stall (%d+)")
  if not port then
    fh:close()
    error("testserver: did not start (said " .. tostring(line) .. ")", 2)
  end
  local host = opts.tls and "localhost" or "127.0.0.1"
  return setmetatable({
    fh = fh, pid = tonumber(pid), port = tonumber(port),
    url = scheme .. "://" .. host .. ":" .. port,
    stall_url = "http://127.0.0.1:" .. stall,
    ca_file = cert, cert_dir = dir,
  }, mt)
end

function _M.stop(self)
  if not self.fh then return end
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  self.fh:close()
  self.fh = nil
  if self.cert_dir then tmp.remove(self.cert_dir) end
end

local function control(self, method, path, body)
  local http = require "moongraph.http"
  local res, err = http.request{
    method = method, url = self.url .. path, body = body,
    headers = body and { ["Content-Type"] = "application/json" } or nil,
    ca_file = self.ca_file, timeout = 10,
  }
  if not res then error("testserver: " .. path .. ": " .. err, 3) end
  if res.status ~= 200 then
    error("testserver: " .. path .. " answered " .. res.status .. ": " .. res.body, 3)
  end
  local v = cjson.decode(res.body)
  if v == nil then error("testserver: " .. path .. ": not JSON: " .. res.body, 3) end
  return v
end

-- Queue scripted replies (a reply table or a list of them); each is used
-- `times` times (default once).
function _M.script(self, replies)
  return control(self, "POST", "/__script", cjson.encode(replies))
end

-- Like script, but replies stay until reset (times defaults to 0 = forever).
function _M.record(self, replies)
  return control(self, "POST", "/__record", cjson.encode(replies))
end

-- Requests the server received (not control ones), oldest first; each is
-- {method, path, query, headers (lower-case names), body}. `path` filters.
function _M.requests(self, path)
  local all = control(self, "GET", "/__requests")
  if not path then return all end
  local out = {}
  for _, r in ipairs(all) do
    if r.path == path then out[#out + 1] = r end
  end
  return out
end

function _M.release(self, key)
  return control(self, "POST", "/__release?key=" .. key, "")
end

-- Counters; with a key, `held` counts only the responses waiting for it.
function _M.stats(self, key)
  return control(self, "GET", "/__stats" .. (key and "?key=" .. key or ""))
end

function _M.reset(self)
  return control(self, "POST", "/__reset", "")
end

return _M
