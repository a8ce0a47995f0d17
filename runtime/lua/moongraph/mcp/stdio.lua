--[[
moongraph.mcp.stdio — the MCP stdio transport: newline-delimited JSON-RPC
messages over a child's stdin/stdout (client) or over our own (server).

Client side: the server program is started with moongraph.process (an
argument list, no shell). Its stdout is read only while some request of
ours waits for an answer, so an idle connection keeps no task busy and a
script that forgets c:close() still ends (the child is then stopped with
the runtime). Messages the server sends while we are idle wait in the pipe.
Its stderr is read at the same times; the last lines are kept for the
message that reports a crash, and each line goes to on_stderr when given.
Closing follows the MCP lifecycle: close the server's stdin, wait, SIGTERM,
wait, SIGKILL.

Server side: reads our stdin until end of file, writes to our stdout.
]]

local core = require "moongraph.core"
local process = require "moongraph.process"
local jsonrpc = require "moongraph.mcp.jsonrpc"

local loop = core.loop
local type, tostring, setmetatable, ipairs, pairs, pcall =
      type, tostring, setmetatable, ipairs, pairs, pcall
local table_concat, table_remove, table_unpack = table.concat, table.remove, table.unpack
local string_format, string_sub, string_find = string.format, string.sub, string.find

local _M = {}

local STDERR_KEEP = 20
-- The environment an MCP server inherits when none is given: the SDK's
-- default list, so secrets in ours do not leak to third-party servers.
_M.INHERITED_ENV = { "HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER" }

local function deliver(session, line, name)
  if string_sub(line, -1) == "\r" then line = string_sub(line, 1, -2) end
  if not string_find(line, "%S") then return end
  local msg, kind = jsonrpc.decode(line)
  if msg then session:receive(msg, kind)
  else session:report(name .. ": unusable message: " .. kind) end
end

---------------------------------------------------------------- client

local Client = {}
Client.__index = Client

--[[ client(opts) -> transport | nil, err
opts: command ({program, arg, ...}), env (added to the inherited
INHERITED_ENV variables; inherit_env = true passes our whole environment),
cwd, stderr ("capture" default | "inherit" | "null"), on_stderr(line),
name (for messages), kill_grace (seconds, default 2). ]]
function _M.client(opts)
  local env = {}
  local ours = process.environ()
  if opts.inherit_env then
    for k, v in pairs(ours) do env[k] = v end
  else
    for _, k in ipairs(_M.INHERITED_ENV) do
      local v = ours[k]
      if v and not v:find("^%(%)") then env[k] = v end
    end
  end
  for k, v in pairs(opts.env or {}) do env[k] = v end
  local stderr = opts.stderr or "capture"
  local p, err = process.spawn(opts.command, {
    env = env, cwd = opts.cwd, stdin = "pipe", stdout = "pipe",
    stderr = stderr == "capture" and "pipe" or stderr,
    kill_grace = opts.kill_grace,
  })
  if not p then return nil, err end
  return setmetatable({
    p = p, name = opts.name or ("mcp server '" .. opts.command[1] .. "'"),
    capture = stderr == "capture", on_stderr = opts.on_stderr,
    tail = {}, grace = opts.kill_grace or 2,
  }, Client)
end

local function keep_stderr(self, line)
  local tail = self.tail
  tail[#tail + 1] = line
  if #tail > STDERR_KEEP then table_remove(tail, 1) end
  if self.on_stderr then pcall(self.on_stderr, line) end
end

-- Why the server is gone, with what it said last on stderr.
local function gone_message(self)
  local p = self.p
  local code, sig = p:wait(1)
  local why
  if not code then why = "closed its stdout"
  elseif sig then why = string_format("was killed by signal %s", sig)
  else why = string_format("exited with code %d", code) end
  if self.capture then
    -- what the crash printed is still in the pipe
    while true do
      local line = p.stderr:read_line(0.5)
      if not line then break end
      keep_stderr(self, line)
    end
  end
  local msg = "the server " .. why
  if #self.tail > 0 then
    local last = self.tail
    if #last > 5 then last = { table_unpack(last, #last - 4) } end
    msg = msg .. "; its stderr ended with: " .. table_concat(last, " | ")
  end
  return msg
end

local function read_stdout(self)
  local session, p = self.session, self.p
  while not self.closing and session:busy() do
    self.in_read = true
    local line, err = p.stdout:read_line()
    self.in_read = false
    if not line then
      self.reader = nil
      if not self.closing then
        session:closed(err and ("cannot read from the server: " .. err) or gone_message(self))
      end
      return
    end
    deliver(session, line, self.name)
  end
  self.reader = nil
end

local function read_stderr(self)
  local p = self.p
  while not self.closing and self.session:busy() do
    self.in_err_read = true
    local line = p.stderr:read_line()
    self.in_err_read = false
    if not line then break end
    keep_stderr(self, line)
  end
  self.err_reader = nil
end

function Client:start(session)
  self.session = session
end

-- A request is about to wait: make sure someone reads the answers.
function Client:wake()
  if self.closing then return end
  -- (a reader left from an earlier mg.run was cancelled with it)
  if not self.reader or self.reader:done() then
    self.in_read = false
    self.reader = loop.spawn(read_stdout, self)
  end
  if self.capture and (not self.err_reader or self.err_reader:done()) then
    self.in_err_read = false
    self.err_reader = loop.spawn(read_stderr, self)
  end
end

-- Nothing waits any more: stop reading (the bytes stay buffered).
function Client:idle()
  if self.reader and self.in_read and self.reader ~= loop.current() then
    self.reader:cancel()
    self.reader, self.in_read = nil, false
  end
  if self.err_reader and self.in_err_read and self.err_reader ~= loop.current() then
    self.err_reader:cancel()
    self.err_reader, self.in_err_read = nil, false
  end
end

function Client:send(msg)
  local text, err = jsonrpc.encode(msg)
  if not text then return nil, err end
  if self.closing then return nil, "connection closed" end
  local ok, werr = self.p:write(text .. "\n")
  if not ok then return nil, "cannot write to the server: " .. tostring(werr) end
  return true
end

-- Stop the server: stdin closed, grace, SIGTERM, grace, SIGKILL.
function Client:close()
  if self.closing then return end
  self.closing = true
  for _, k in ipairs { "reader", "err_reader" } do
    local t = self[k]
    if t and t ~= loop.current() and not t:done() then t:cancel() end
    self[k] = nil
  end
  if loop.current() then
    self.p:shutdown(self.grace)
  end
  self.p:close()
end

function Client:pid()
  return self.p:pid()
end

---------------------------------------------------------------- server

local Server = {}
Server.__index = Server

-- server() -> transport over our own stdin/stdout
function _M.server(opts)
  opts = opts or {}
  return setmetatable({ io = core.process.stdio(), name = opts.name or "mcp client" }, Server)
end

function Server:start(session)
  self.session = session
end

-- Read messages until the client closes our stdin. Runs in the calling task.
function Server:run()
  local io_, session = self.io, self.session
  while true do
    local line, err = io_:read(1, "l")
    if not line then
      session:closed(err and ("cannot read stdin: " .. err) or "the client closed the connection")
      return
    end
    deliver(session, line, self.name)
  end
end

function Server:send(msg)
  local text, err = jsonrpc.encode(msg)
  if not text then return nil, err end
  local ok, werr = self.io:write(text .. "\n")
  if not ok then return nil, "cannot write to stdout: " .. tostring(werr) end
  return true
end

function Server:close() end

return _M
