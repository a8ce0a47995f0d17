-- moongraph.redis — Redis client for tasks.
--
--   local redis = require "moongraph.redis"
--   local r = assert(redis.connect("redis://:pw@127.0.0.1:6379/0", { timeout = 2 }))
--   r:call("SET", "k", "v")                 --> "OK"
--   r:call("GET", "missing")                --> redis.null
--   r:call("NOPE")                          --> nil, "ERR unknown command ..."
--   r:pipeline(function(p) p:call("MULTI"); p:call("INCR", "n"); p:call("EXEC") end)
--   local sub = assert(r:subscribe({ "news" }))
--   for msg in sub:messages() do print(msg.channel, msg.data) end
--   local pool = redis.pool(url, { size = 8 })
--
-- One connection serves any number of tasks at once: their commands are
-- pipelined on the socket and each task gets its own reply. Blocking
-- commands (BLPOP, XREAD ... BLOCK, ...) run on separate connections so they
-- never hold up the others; subscriptions get a connection of their own too.
-- A connection that was lost is opened again (with AUTH and SELECT) by the
-- next command; the command that saw the loss fails with its reason.
--
-- redis-sentinel://host:port,host:port/MASTER[/db] finds the master through
-- Redis Sentinel (moongraph.redis.sentinel) each time a connection is
-- opened, and checks with ROLE that it is one. During a failover, opening
-- is retried with a short backoff for up to the command's timeout (the
-- connect timeout when it has none), and a command refused by a demoted
-- master (READONLY) or a node still loading (LOADING) is sent again to the
-- new master within that time.
--
-- Replies: status and bulk strings -> string, integer -> integer, nil bulk or
-- nil array -> redis.null, array -> list, an error reply -> nil, err (inside
-- arrays and pipelines: {false, err}, as lua-resty-redis does).

local errors = require "moongraph.errors"
local core = require("moongraph.core")
local sentinel = require("moongraph.redis.sentinel")
local craw = core.redis
local loop = core.loop

local type, error, tostring, tonumber, select, setmetatable, ipairs =
  type, error, tostring, tonumber, select, setmetatable, ipairs
local concat, remove, unpack = table.concat, table.remove, table.unpack
local format, upper = string.format, string.upper
local min = math.min

local _M = { null = craw.null }

local DEFAULT_CONNECT_TIMEOUT = 5

-- Commands that would break a connection shared by many tasks, and what to
-- use instead.
local refused = {
  SUBSCRIBE = "use conn:subscribe(channels)",
  PSUBSCRIBE = "use conn:psubscribe(patterns)",
  SSUBSCRIBE = "use conn:subscribe(channels)",
  UNSUBSCRIBE = "use sub:unsubscribe(channels)",
  PUNSUBSCRIBE = "use sub:punsubscribe(patterns)",
  SUNSUBSCRIBE = "use sub:unsubscribe(channels)",
  MULTI = "send MULTI ... EXEC in one conn:pipeline(fn)",
  EXEC = "send MULTI ... EXEC in one conn:pipeline(fn)",
  DISCARD = "send MULTI ... EXEC in one conn:pipeline(fn)",
  WATCH = "WATCH needs a connection of its own, which this client does not offer",
  UNWATCH = "WATCH needs a connection of its own, which this client does not offer",
  SELECT = "put the database number in the URL (redis://host:port/db)",
  AUTH = "put the password in the URL (redis://:password@host:port)",
  QUIT = "use conn:close()",
  MONITOR = "MONITOR takes over the connection",
  RESET = "RESET would drop AUTH and SELECT for every task on the connection",
}

-- Commands that block the connection until data arrives. WAIT and WAITAOF
-- wait for the writes of their own connection: sent with conn:call they
-- run on a connection of their own that wrote nothing, so they belong at
-- the end of the pipeline whose writes they wait for.
local blocking = {
  BLPOP = true, BRPOP = true, BRPOPLPUSH = true, BLMOVE = true, BLMPOP = true,
  BZPOPMIN = true, BZPOPMAX = true, BZMPOP = true, WAIT = true, WAITAOF = true,
}

local function is_blocking(name, ...)
  if blocking[name] then return true end
  if name == "XREAD" or name == "XREADGROUP" then
    for i = 1, select("#", ...) do
      local a = select(i, ...)
      if type(a) == "string" and upper(a) == "BLOCK" then return true end
    end
  end
  return false
end

---------------------------------------------------------------- URLs

local function unescape(s)
  return (s:gsub("%%(%x%x)", function(h) return string.char(tonumber(h, 16)) end))
end

local function parse_query(q, cfg)
  for k, v in q:gmatch("([^&=]+)=([^&]*)") do
    v = unescape(v)
    if k == "db" then cfg.db = tonumber(v)
    elseif k == "timeout" then cfg.timeout = tonumber(v)
    elseif k == "connect_timeout" then cfg.connect_timeout = tonumber(v)
    elseif k == "password" then cfg.password = v
    elseif k == "sentinel_password" and cfg.sentinels then cfg.sentinel_password = v
    elseif k == "sentinel_password" then return nil, "sentinel_password is for redis-sentinel:// URLs"
    else return nil, "unknown URL parameter '" .. k .. "'" end
  end
  return true
end

local SENTINEL_FORM = "redis-sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER[/db]"

-- The sentinels, the master's name and the database of a redis-sentinel:// URL.
local function parse_sentinel_part(hostpart, cfg, url)
  local list, master, db = hostpart:match("^([^/]*)/?([^/]*)/?(.*)$")
  local hosts, err = sentinel.parse_hosts(list)
  if not hosts then return nil, format("%s in URL: %s (%s)", err, url, SENTINEL_FORM) end
  if master == "" then return nil, format("no master name in URL: %s (%s)", url, SENTINEL_FORM) end
  if db ~= "" then
    cfg.db = tonumber(db)
    if not cfg.db or db:find("[^%d]") then return nil, "bad database number in URL: " .. url end
  end
  cfg.sentinels = hosts
  cfg.master = unescape(master)
  local addrs = {}
  for i = 1, #hosts do addrs[i] = hosts[i].addr end
  cfg.addr = format("master '%s' of sentinels %s", cfg.master, concat(addrs, ","))
  return true
end

-- redis://[[user]:password@]host[:port][/db][?timeout=s&connect_timeout=s]
-- unix://[[user]:password@]/path/to.sock[?db=n&timeout=s]
-- redis-sentinel://[[user]:password@]host[:port][,host[:port]...]/MASTER[/db]
--   [?sentinel_password=pw&timeout=s&connect_timeout=s]
--   (the user and password are the data nodes'; sentinels default to port 26379)
function _M.parse_url(url)
  if type(url) ~= "string" then return nil, "URL must be a string" end
  local scheme, rest = url:match("^(%a[%w+.-]*)://(.*)$")
  if not scheme then return nil, "not a redis://, redis-sentinel:// or unix:// URL: " .. url end
  scheme = scheme:lower()
  if scheme == "rediss" then
    return nil, "rediss:// (TLS) is not supported by this build's hiredis"
  end
  if scheme ~= "redis" and scheme ~= "unix" and scheme ~= "redis-sentinel" then
    return nil, "unsupported URL scheme '" .. scheme .. "' (redis://, redis-sentinel:// or unix://)"
  end
  local cfg = { db = 0, connect_timeout = DEFAULT_CONNECT_TIMEOUT }
  local query
  rest, query = rest:match("^([^?]*)%??(.*)$")
  local userinfo, hostpart = rest:match("^(.*)@(.-)$")
  if not userinfo then hostpart = rest end
  if userinfo then
    local user, pw = userinfo:match("^([^:]*):(.*)$")
    if user then
      if user ~= "" then cfg.user = unescape(user) end
      cfg.password = unescape(pw)
    else
      cfg.password = unescape(userinfo)
    end
  end
  if scheme == "unix" then
    if hostpart == "" or hostpart:sub(1, 1) ~= "/" then
      return nil, "unix:// URL needs an absolute socket path: " .. url
    end
    cfg.path = unescape(hostpart)
    cfg.addr = cfg.path
  elseif scheme == "redis-sentinel" then
    local ok, err = parse_sentinel_part(hostpart, cfg, url)
    if not ok then return nil, err end
  else
    local host, port, db
    if hostpart:sub(1, 1) == "[" then
      host, port, db = hostpart:match("^%[([^%]]+)%]:?(%d*)/?(.*)$")
    else
      host, port, db = hostpart:match("^([^:/]*):?(%d*)/?(.*)$")
    end
    if not host or host == "" then return nil, "no host in URL: " .. url end
    cfg.host = host
    cfg.port = port ~= "" and tonumber(port) or 6379
    if cfg.port < 1 or cfg.port > 65535 then return nil, "bad port in URL: " .. url end
    if db ~= "" then
      cfg.db = tonumber(db)
      if not cfg.db or db:find("[^%d]") then return nil, "bad database number in URL: " .. url end
    end
    cfg.addr = host .. ":" .. cfg.port
  end
  if query ~= "" then
    local ok, err = parse_query(query, cfg)
    if not ok then return nil, err .. " in " .. url end
  end
  if not cfg.db or cfg.db < 0 or math.type(cfg.db) ~= "integer" then
    return nil, "bad database number in URL: " .. url
  end
  return cfg
end

-- One physical connection, authenticated and on the right database; with
-- expect_master, also checked with ROLE to be a master. -> raw | nil, err,
-- permanent (permanent: AUTH or SELECT refused).
local function open_raw(cfg, timeout, expect_master)
  local raw, err
  if cfg.path then raw, err = craw.connect(cfg.path, nil, cfg.connect_timeout)
  else raw, err = craw.connect(cfg.host, cfg.port, cfg.connect_timeout) end
  if not raw then return nil, err end
  raw:set_timeout(cfg.connect_timeout)
  local cmds = {}
  if cfg.password then
    cmds[#cmds + 1] = cfg.user and { "AUTH", cfg.user, cfg.password } or { "AUTH", cfg.password }
  end
  if cfg.db ~= 0 then cmds[#cmds + 1] = { "SELECT", cfg.db } end
  if expect_master then cmds[#cmds + 1] = { "ROLE" } end
  if #cmds > 0 then
    local res, perr = raw:pipeline(cmds)
    if not res then
      raw:close()
      return nil, perr
    end
    for i = 1, #res do
      local r = res[i]
      if type(r) == "table" and r[1] == false then
        raw:close()
        return nil, errors.wrap(r[2], nil, format("redis: %s on %s failed: %s", cmds[i][1], cfg.addr,
          tostring(r[2]))), cmds[i][1] ~= "ROLE"
      end
    end
    if expect_master and not (type(res[#res]) == "table" and res[#res][1] == "master") then
      raw:close()
      return nil, format("redis-sentinel: %s, given as the master, is a %s (failover in progress?)",
        cfg.addr, tostring(type(res[#res]) == "table" and res[#res][1] or "node of unknown role"))
    end
  end
  raw:set_timeout(timeout or 0)
  return raw
end

-- A connection to the master: the URL's address, or the one the sentinels
-- give.
local function open_master(cfg, timeout)
  if not cfg.sentinels then return open_raw(cfg, timeout) end
  local host, port, permanent = sentinel.master_addr(cfg)
  if not host then return nil, port, permanent end
  local node = {
    host = host, port = port, addr = host .. ":" .. port, db = cfg.db,
    user = cfg.user, password = cfg.password, connect_timeout = cfg.connect_timeout,
  }
  return open_raw(node, timeout, true)
end

-- How long a command may wait for a failover to end: its timeout, or the
-- connect timeout for commands without one.
local function failover_wait(self)
  local t = self.timeout
  if t and t > 0 then return t end
  return self.cfg.connect_timeout
end

-- open_master; with sentinels, a master that cannot be had (a failover in
-- progress) is looked up again, with a short backoff, until `deadline`.
-- A refused password or an unknown master name is reported at once.
local function open_failover(cfg, timeout, deadline)
  local raw, err, permanent = open_master(cfg, timeout)
  if raw or permanent or not cfg.sentinels then return raw, err end
  local delay = 0.05
  while loop.now() + delay < deadline do
    loop.sleep(delay)
    raw, err, permanent = open_master(cfg, timeout)
    if raw or permanent then return raw, err end
    delay = min(delay * 2, 0.5)
  end
  return nil, err
end

---------------------------------------------------------------- connections

local Conn = {}
Conn.__index = Conn

local function check_conn(self, fname)
  if getmetatable(self) ~= Conn then
    error(format("bad self to '%s' (redis connection expected, got %s)", fname, type(self)), 3)
  end
end

-- Wake every task suspended in list with value v.
local function wake_all(list, v)
  for i = 1, #list do loop.wake(list[i], v) end
end

-- The shared connection, opened (again) when needed. Tasks that arrive
-- while another one is connecting wait for that attempt instead of opening
-- their own. With sentinels, the master is looked up at each opening,
-- until `deadline` (default: failover_wait from now).
local function ensure(self, deadline)
  local raw = self.raw
  if raw and raw:connected() then return raw end
  if self.closed then return nil, errors.new("cancelled", "redis: connection closed") end
  if self.connecting then
    local list = self.connecting
    list[#list + 1] = loop.current()
    loop.suspend()
    raw = self.raw
    if raw and raw:connected() then return raw end
    return nil, self.last_error or "redis: connection closed"
  end
  local waiters = {}
  self.connecting = waiters
  local guard <close> = setmetatable({}, { __close = function()
    self.connecting = nil
    wake_all(waiters, true)
  end })
  local err
  raw, err = open_failover(self.cfg, self.timeout, deadline or loop.now() + failover_wait(self))
  if self.closed and raw then
    raw:close()
    return nil, errors.new("cancelled", "redis: connection closed")
  end
  self.raw = raw
  self.last_error = err
  if not raw then return nil, err end
  return raw
end

local function check_name(fname, cmd)
  if type(cmd) ~= "string" or cmd == "" then
    error(format("bad argument #1 to '%s' (command name expected, got %s)", fname, type(cmd)), 3)
  end
  return upper(cmd)
end

-- Stop using the shared connection `raw` (a demoted master's): the next
-- command opens a new one. Replies still due on it are awaited first.
local function retire(self, raw)
  if self.raw == raw then self.raw = nil end
  if raw:inflight() == 0 then raw:close() end
end

local function demoted_in(res)
  for i = 1, #res do
    local r = res[i]
    if type(r) == "table" and r[1] == false and sentinel.demoted(r[2]) then return r[2] end
  end
  return nil
end

-- The pause before sending again what a demoted master refused, or nil
-- when the command's time for a failover is over.
local function next_delay(deadline, delay)
  delay = delay and min(delay * 2, 0.5) or 0.05
  if loop.now() + delay >= deadline then return nil end
  return delay
end

local function blocking_once(self, deadline, ...)
  local idle = self.blocking_idle
  local raw = remove(idle)
  while raw and not raw:connected() do raw = remove(idle) end
  if not raw then
    local err
    raw, err = open_failover(self.cfg, 0, deadline)
    if not raw then return nil, err end
    raw:set_drop_on_cancel(true)
  end
  local busy = self.blocking_busy
  busy[raw] = true
  self.blocking_n = self.blocking_n + 1
  local guard <close> = setmetatable({}, { __close = function()
    busy[raw] = nil
    self.blocking_n = self.blocking_n - 1
    -- keep as many as are in use at once (at least 8): a gateway following
    -- hundreds of streams reuses its connections instead of opening one
    -- per wait
    if raw:connected() and not self.closed and #idle < math.max(8, self.blocking_n + 1) then
      idle[#idle + 1] = raw
    else raw:close() end
  end })
  local res, err = raw:call(...)
  -- a demoted master: drop this connection, the retry looks the master up
  if res == nil and self.cfg.sentinels and sentinel.demoted(err) then raw:close() end
  return res, err
end

-- Commands refused by a demoted master (READONLY) or by one still loading
-- its data (LOADING) did not run: with sentinels they are sent again, after
-- a short pause, to the master looked up anew, until the command's
-- failover_wait is over.
local function blocking_call(self, ...)
  if self.closed then return nil, errors.new("cancelled", "redis: connection closed") end
  local deadline = loop.now() + failover_wait(self)
  local delay
  while true do
    local res, err = blocking_once(self, deadline, ...)
    if res ~= nil or not (self.cfg.sentinels and sentinel.demoted(err)) or self.closed then
      return res, err
    end
    delay = next_delay(deadline, delay)
    if not delay then return res, err end
    loop.sleep(delay)
  end
end

-- raw:call(...) on the master, again after a demoted master's refusal
-- (see blocking_call).
local function call_on_master(self, raw, ...)
  local deadline, delay
  while true do
    local res, err = raw:call(...)
    if res ~= nil or not sentinel.demoted(err) or self.closed then return res, err end
    retire(self, raw)
    deadline = deadline or loop.now() + failover_wait(self)
    delay = next_delay(deadline, delay)
    if not delay then return res, err end
    loop.sleep(delay)
    raw, err = ensure(self, deadline)
    if not raw then return nil, err end
  end
end

local function pipeline_on_master(self, raw, cmds)
  local deadline, delay
  while true do
    local res, err = raw:pipeline(cmds)
    if not res or self.closed or not demoted_in(res) then return res, err end
    retire(self, raw)
    deadline = deadline or loop.now() + failover_wait(self)
    delay = next_delay(deadline, delay)
    if not delay then return res end
    loop.sleep(delay)
    raw, err = ensure(self, deadline)
    if not raw then return nil, err end
  end
end

-- conn:call(cmd, ...) -> reply | nil, err
function Conn:call(cmd, ...)
  check_conn(self, "call")
  local name = check_name("call", cmd)
  local why = refused[name]
  if why then
    error(format("bad argument #1 to 'call' (%s cannot be sent on a shared connection: %s)", name, why), 2)
  end
  if name == "CLIENT" and type((...)) == "string" and upper((...)) == "REPLY" then
    error("bad argument #1 to 'call' (CLIENT REPLY would desynchronise the connection)", 2)
  end
  if is_blocking(name, ...) then return blocking_call(self, cmd, ...) end
  local raw, err = ensure(self)
  if not raw then return nil, err end
  if not self.cfg.sentinels then return raw:call(cmd, ...) end
  return call_on_master(self, raw, cmd, ...)
end

local Pipeline = {}
Pipeline.__index = Pipeline

-- A command that cannot go in a pipeline raises, naming it.
local function check_pipelined(name, level, ...)
  if refused[name] and name ~= "MULTI" and name ~= "EXEC" and name ~= "DISCARD" then
    error(format("bad argument #1 to 'call' (%s cannot be sent on a shared connection: %s)",
      name, refused[name]), level + 1)
  end
  if is_blocking(name, ...) and name ~= "WAIT" and name ~= "WAITAOF" then
    error(format("bad argument #1 to 'call' (blocking command %s cannot be pipelined; use conn:call)", name),
      level + 1)
  end
end

function Pipeline:call(cmd, ...)
  local name = check_name("call", cmd)
  check_pipelined(name, 2, ...)
  local n = select("#", ...)
  local c = { cmd, ... }
  for i = 1, n do
    local v = c[i + 1]
    local tv = type(v)
    if tv ~= "string" and tv ~= "number" then
      error(format("bad argument #%d to 'call' (string or number expected, got %s)", i + 1, tv), 2)
    end
  end
  local cmds = self.cmds
  cmds[#cmds + 1] = c
  return self
end

-- Command names, as written, that a pipeline takes whatever their arguments
-- (none refused, blocking or XREAD): checked once (a bounded set: names are
-- few, but a caller could pass any string)
local pipelinable, pipelinable_n, PIPELINABLE_MAX = {}, 0, 256

-- conn:pipeline(fn) or conn:pipeline({ {cmd, ...}, ... }) -> { reply, ... } | nil, err
-- fn(p) queues commands with p:call(...); they are sent together when fn
-- returns, so MULTI ... EXEC inside one pipeline is a transaction no other
-- task's commands can interleave with.
function Conn:pipeline(fn)
  check_conn(self, "pipeline")
  local cmds
  if type(fn) == "function" then
    local p = setmetatable({ cmds = {} }, Pipeline)
    fn(p)
    cmds = p.cmds
  elseif type(fn) == "table" then
    -- the lists as given: names checked here, arguments by the connection
    -- before anything is sent
    for i = 1, #fn do
      local c = fn[i]
      if type(c) ~= "table" then
        error(format("bad argument #1 to 'pipeline' (command %d is not a list)", i), 2)
      end
      local cmd = c[1]
      if not pipelinable[cmd] then
        if type(cmd) ~= "string" or cmd == "" then
          error(format("bad argument #1 to 'call' (command name expected, got %s)", type(cmd)), 2)
        end
        local name = upper(cmd)
        if refused[name] or blocking[name] or name == "XREAD" or name == "XREADGROUP" then
          check_pipelined(name, 2, unpack(c, 2, #c))
        elseif pipelinable_n < PIPELINABLE_MAX then
          pipelinable[cmd], pipelinable_n = true, pipelinable_n + 1
        end
      end
    end
    cmds = fn
  else
    error("bad argument #1 to 'pipeline' (function or list of commands expected)", 2)
  end
  if #cmds == 0 then return {} end
  local raw, err = ensure(self)
  if not raw then return nil, err end
  if not self.cfg.sentinels then return raw:pipeline(cmds) end
  return pipeline_on_master(self, raw, cmds)
end

-- conn:set_timeout(sec): bound on every later command (0 or nil: none).
-- A command that times out returns nil, "redis: timeout after ...s" and its
-- connection is closed (the next command opens a new one).
function Conn:set_timeout(sec)
  check_conn(self, "set_timeout")
  if sec ~= nil and (type(sec) ~= "number" or sec < 0) then
    error("bad argument #1 to 'set_timeout' (non-negative number of seconds expected)", 2)
  end
  self.timeout = sec or 0
  if self.raw then self.raw:set_timeout(self.timeout) end
end

function Conn:close()
  check_conn(self, "close")
  self.closed = true
  if self.raw then self.raw:close() end
  for i = 1, #self.blocking_idle do self.blocking_idle[i]:close() end
  self.blocking_idle = {}
  for raw in pairs(self.blocking_busy) do raw:close() end
  for i = #self.subs, 1, -1 do self.subs[i]:close() end
end

function Conn:connected()
  return self.raw ~= nil and self.raw:connected()
end

Conn.__close = Conn.close

function Conn:__tostring()
  return format("redis connection to %s (%s)", self.cfg.addr,
    self.closed and "closed" or (self:connected() and "open" or "not connected"))
end

---------------------------------------------------------------- pub/sub

local Sub = {}
Sub.__index = Sub

local function sub_open(self)
  local raw, err = open_failover(self.cfg, self.timeout, loop.now() + failover_wait(self))
  if not raw then return nil, err end
  local names = {}
  for n in pairs(self.channels) do names[#names + 1] = n end
  if #names > 0 then
    local ok, serr = raw:subscribe("SUBSCRIBE", names)
    if not ok then raw:close() return nil, serr end
  end
  names = {}
  for n in pairs(self.patterns) do names[#names + 1] = n end
  if #names > 0 then
    local ok, serr = raw:subscribe("PSUBSCRIBE", names)
    if not ok then raw:close() return nil, serr end
  end
  self.raw = raw
  return raw
end

local function check_names(fname, list)
  if type(list) == "string" then list = { list } end
  if type(list) ~= "table" or #list == 0 then
    error(format("bad argument #1 to '%s' (channel name or non-empty list expected)", fname), 3)
  end
  for i = 1, #list do
    if type(list[i]) ~= "string" then
      error(format("bad argument #1 to '%s' (item %d is not a string)", fname, i), 3)
    end
  end
  return list
end

local function new_sub(conn, channels, patterns)
  local sub = setmetatable({
    cfg = conn.cfg, timeout = conn.timeout, channels = {}, patterns = {},
    conn = conn, closed = false,
  }, Sub)
  for i = 1, #channels do sub.channels[channels[i]] = true end
  for i = 1, #patterns do sub.patterns[patterns[i]] = true end
  local raw, err = sub_open(sub)
  if not raw then return nil, err end
  local subs = conn.subs
  subs[#subs + 1] = sub
  return sub
end

-- conn:subscribe(channels) -> sub | nil, err. The subscription has a
-- connection of its own; it is confirmed by Redis when this returns.
function Conn:subscribe(channels)
  check_conn(self, "subscribe")
  channels = check_names("subscribe", channels)
  if self.closed then return nil, errors.new("cancelled", "redis: connection closed") end
  return new_sub(self, channels, {})
end

-- conn:psubscribe(patterns) -> sub | nil, err
function Conn:psubscribe(patterns)
  check_conn(self, "psubscribe")
  patterns = check_names("psubscribe", patterns)
  if self.closed then return nil, errors.new("cancelled", "redis: connection closed") end
  return new_sub(self, {}, patterns)
end

local function sub_change(self, verb, set, add, list)
  local raw = self.raw
  if self.closed then return nil, errors.new("cancelled", "redis: subscription closed") end
  local names = {}
  for i = 1, #list do
    local n = list[i]
    if add and not set[n] then names[#names + 1] = n end
    if not add and set[n] then names[#names + 1] = n end
    set[n] = add or nil
  end
  if #names == 0 or not (raw and raw:connected()) then return true end
  return raw:subscribe(verb, names)
end

function Sub:subscribe(channels)
  return sub_change(self, "SUBSCRIBE", self.channels, true, check_names("subscribe", channels))
end

function Sub:psubscribe(patterns)
  return sub_change(self, "PSUBSCRIBE", self.patterns, true, check_names("psubscribe", patterns))
end

function Sub:unsubscribe(channels)
  return sub_change(self, "UNSUBSCRIBE", self.channels, false, check_names("unsubscribe", channels))
end

function Sub:punsubscribe(patterns)
  return sub_change(self, "PUNSUBSCRIBE", self.patterns, false, check_names("punsubscribe", patterns))
end

-- sub:next([timeout]) -> {kind=, channel=, data=, pattern=} | nil, "timeout" | nil, err
-- When the connection is lost, one call returns nil, err (messages sent
-- meanwhile are gone: that is pub/sub); the next call subscribes again on a
-- new connection.
function Sub:next(timeout)
  if getmetatable(self) ~= Sub then
    error("bad self to 'next' (subscription expected)", 2)
  end
  if timeout ~= nil and (type(timeout) ~= "number" or timeout < 0) then
    error("bad argument #1 to 'next' (non-negative number of seconds expected)", 2)
  end
  if self.closed then return nil, errors.new("cancelled", "redis: subscription closed") end
  local raw = self.raw
  if not raw then
    local err
    raw, err = sub_open(self)
    if not raw then return nil, err end
  end
  local msg, err = raw:next_message(timeout)
  if msg then return msg end
  if err ~= "timeout" and not raw:connected() then
    self.raw = nil
    if self.closed then return nil, errors.new("cancelled", "redis: subscription closed") end
  end
  return nil, err
end

-- for msg in sub:messages([timeout]) do ... end
-- Ends on timeout, close or connection loss; sub.err then says why.
function Sub:messages(timeout)
  return function()
    local msg, err = self:next(timeout)
    if not msg then self.err = err end
    return msg
  end
end

function Sub:close()
  if self.closed then return end
  self.closed = true
  if self.raw then self.raw:close() end
  self.raw = nil
  local subs = self.conn.subs
  for i = #subs, 1, -1 do
    if subs[i] == self then remove(subs, i) end
  end
end

Sub.__close = Sub.close

---------------------------------------------------------------- constructors

local function options(fname, opts)
  if opts == nil then return {} end
  if type(opts) ~= "table" then
    error(format("bad argument #2 to '%s' (options table expected, got %s)", fname, type(opts)), 3)
  end
  for k, v in pairs(opts) do
    if k ~= "size" and k ~= "timeout" and k ~= "connect_timeout" then
      error(format("bad argument #2 to '%s' (unknown option '%s')", fname, tostring(k)), 3)
    end
    if type(v) ~= "number" or v < 0 then
      error(format("bad argument #2 to '%s' (option '%s' must be a non-negative number)", fname, k), 3)
    end
  end
  return opts
end

local function new_conn(fname, url, opts)
  local cfg, err = _M.parse_url(url)
  if not cfg then error(format("bad argument #1 to '%s' (%s)", fname, err), 3) end
  if opts.connect_timeout then cfg.connect_timeout = opts.connect_timeout end
  return setmetatable({
    cfg = cfg,
    timeout = opts.timeout or cfg.timeout or 0,
    blocking_idle = {},
    blocking_busy = {},
    blocking_n = 0,
    subs = {},
    closed = false,
  }, Conn)
end

-- redis.connect(url [, {timeout=, connect_timeout=}]) -> conn | nil, err
-- Connects at once, so a wrong address or password is reported here.
function _M.connect(url, opts)
  opts = options("connect", opts)
  local conn = new_conn("connect", url, opts)
  local raw, err = ensure(conn)
  if not raw then return nil, err end
  return conn
end

---------------------------------------------------------------- pools

local Pool = {}
Pool.__index = Pool

-- redis.pool(url [, {size=, timeout=, connect_timeout=}]) -> pool
-- `size` connections (default 4), opened when first used; each command
-- goes to the connection with the fewest commands in flight.
function _M.pool(url, opts)
  opts = options("pool", opts)
  local size = opts.size or 4
  if size < 1 or math.type(size) ~= "integer" then
    error("bad argument #2 to 'pool' (size must be a positive integer)", 2)
  end
  local conns = {}
  for i = 1, size do conns[i] = new_conn("pool", url, opts) end
  return setmetatable({ conns = conns, size = size, next = 1 }, Pool)
end

local function pick(self)
  local conns = self.conns
  local best, load
  for i = 1, #conns do
    local c = conns[i]
    local raw = c.raw
    local l = (raw and raw:connected()) and raw:inflight() or -1
    if l == -1 and not c.connecting then
      -- an unopened connection: open it only if every open one is busy
      l = 1
    end
    if not best or l < load then best, load = c, l end
  end
  return best
end

function Pool:call(...) return pick(self):call(...) end
function Pool:pipeline(fn) return pick(self):pipeline(fn) end
function Pool:subscribe(channels) return self.conns[1]:subscribe(channels) end
function Pool:psubscribe(patterns) return self.conns[1]:psubscribe(patterns) end

function Pool:set_timeout(sec)
  for i = 1, #self.conns do self.conns[i]:set_timeout(sec) end
end

function Pool:close()
  for i = 1, #self.conns do self.conns[i]:close() end
end

Pool.__close = Pool.close

return _M
