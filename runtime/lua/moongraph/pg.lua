-- moongraph.pg — PostgreSQL client for tasks.
--
--   local pg = require "moongraph.pg"
--   local db = assert(pg.connect("postgresql://user@127.0.0.1:5432/app", { statement_timeout = 5 }))
--   local rows, n = db:query("SELECT id, doc FROM t WHERE name = $1 AND size > $2", { name, 10 })
--   db:exec("CREATE TABLE a (...); CREATE INDEX ...")       --> true | nil, err
--   db:transaction(function(tx) tx:query(...); tx:send(...); tx:query(...) end)
--   db:transaction(function(tx)           -- two reads in one round trip
--     local first = tx:defer(sql1, params1)
--     tx:commit_with_next()                -- and the COMMIT with them
--     local rows2 = tx:query(sql2, params2)
--     local rows1 = first()
--   end)
--   tx:is_open()                           -- false once its COMMIT went
--   local pool = pg.pool(url, { size = 8 })                  -- same methods as db
--
-- Statements take $1..$n parameters only; values are never spliced into the
-- SQL text. Lua values are sent typed: booleans as bool, integers as int8,
-- floats as float8, strings as text (bytes that are not UTF-8 as bytea),
-- tables as jsonb, pg.bytea(s) as bytea, pg.null as NULL.
--
-- Rows come back as a list of tables keyed by column name: integer columns
-- as integers, float4/float8 as numbers, bool as booleans, json/jsonb
-- decoded, bytea as raw strings, numeric and everything else as the server's
-- text; NULL is pg.null. query returns rows plus the affected or returned
-- row count; failures return nil, err, sqlstate.
--
-- A connection runs one statement at a time; tasks sharing it take turns
-- in arrival order. A connection the server dropped (restart, crash) is
-- opened again before the next statement; a statement that was running
-- when it dropped fails with the reason.

local errors = require "moongraph.errors"
local core = require("moongraph.core")
local json = require "moongraph.json"
local cjson = json.wire { raise = true }
local cpg = core.pg
local loop = core.loop

local type, error, pcall, setmetatable, getmetatable, tostring, select =
  type, error, pcall, setmetatable, getmetatable, tostring, select
local remove, pack, unpack = table.remove, table.pack, table.unpack
local format, floor = string.format, math.floor

local _M = { null = cpg.null }

local bytea_mt = { __name = "pg.bytea" }

-- pg.bytea(s): send s as bytea whatever its bytes are.
function _M.bytea(s)
  if type(s) ~= "string" then
    error(format("bad argument #1 to 'bytea' (string expected, got %s)", type(s)), 2)
  end
  return setmetatable({ s }, bytea_mt)
end

cpg.set_codecs(cjson.encode, cjson.decode, bytea_mt)

---------------------------------------------------------------- turns

-- A gate hands out `size` resources in arrival order. A resource given
-- back goes straight to the longest waiting task, so newcomers cannot jump
-- the queue. A task cancelled while it waits (or just after it was served)
-- passes its resource on.
local function gate_release(g, item)
  local waiters = g.waiters
  while #waiters > 0 do
    local entry = remove(waiters, 1)
    entry.item = item
    if loop.wake(entry.task) then return end
    entry.item = nil                          -- timed out meanwhile
  end
  local idle = g.idle
  idle[#idle + 1] = item
end

local function gate_acquire(g, timeout)
  local item = remove(g.idle)
  if item ~= nil then return item end
  if g.made < g.size then
    g.made = g.made + 1
    return g.make()
  end
  local entry = { task = loop.current() }
  if not entry.task then
    error("pg: not inside a moongraph task (use mg.run or mg.spawn)", 3)
  end
  local waiters = g.waiters
  waiters[#waiters + 1] = entry
  local guard <close> = setmetatable({}, { __close = function()
    if entry.item == nil then
      for i = #waiters, 1, -1 do
        if waiters[i] == entry then remove(waiters, i) end
      end
    elseif not entry.taken then
      gate_release(g, entry.item)
    end
  end })
  loop.suspend(timeout)
  if entry.item ~= nil then
    entry.taken = true
    return entry.item
  end
  return nil, "timeout"
end

---------------------------------------------------------------- connections

local function open_raw(cfg)
  local raw, err = cpg.connect(cfg.url, cfg.connect_timeout)
  if not raw then return nil, err end
  if cfg.statement_timeout then
    local ok, serr = raw:exec(format("SET statement_timeout = %d", floor(cfg.statement_timeout * 1000 + 0.5)))
    if not ok then
      raw:close()
      return nil, serr
    end
  end
  return raw
end

-- The slot's connection, opened again when the server dropped it.
local function slot_raw(cfg, slot)
  local raw = slot.raw
  if raw and raw:ok() then return raw end
  if raw then raw:close() end
  slot.raw = nil
  local err
  raw, err = open_raw(cfg)
  slot.raw = raw
  return raw, err
end

-- Statements on one slot, used while its turn is held.
local function run_query(raw, sql, params)
  if params == nil then return raw:query(sql) end
  return raw:query(sql, params, params.n or #params)
end

-- A statement into the connection's batch (sent with its next sync);
-- with keep, its rows are kept and its position returned.
local function send_one(raw, sql, params, keep)
  if params == nil then return raw:send(sql, nil, nil, keep) end
  return raw:send(sql, params, params.n or #params, keep)
end

local function check_sql(fname, sql, params)
  if type(sql) ~= "string" then
    error(format("bad argument #1 to '%s' (SQL string expected, got %s)", fname, type(sql)), 3)
  end
  if params ~= nil and type(params) ~= "table" then
    error(format("bad argument #2 to '%s' (list of parameters expected, got %s)", fname, type(params)), 3)
  end
end

---------------------------------------------------------------- transactions

local Tx = {}
Tx.__index = Tx

local function tx_check(tx, fname)
  if getmetatable(tx) ~= Tx then
    error(format("bad self to '%s' (transaction expected)", fname), 3)
  end
  if tx.finished then
    error(format("'%s': the transaction is already finished", fname), 3)
  end
end

-- A statement after those the transaction sent ahead of it (tx:send, its
-- BEGIN): all go in one round trip, and the last one's results come back.
local function run_in(raw, sql, params)
  if raw:pending() == 0 then return run_query(raw, sql, params) end
  local ok, err = send_one(raw, sql, params)
  if not ok then return nil, err end
  return raw:sync()
end

-- The statement that ends the transaction: COMMIT, or for a savepoint
-- RELEASE.
local function end_sql(tx)
  return tx.sp and ("RELEASE SAVEPOINT " .. tx.sp) or "COMMIT"
end

-- The round trip that, after tx:commit_with_next, also ends the
-- transaction: its COMMIT goes with what was sent -> true | nil, err, ...
local function commit_round_trip(tx)
  local raw = tx.raw
  local ok, err = raw:send(end_sql(tx))
  if not ok then return nil, err end
  -- (committed: the end was sent; run_tx reads how it went)
  tx.finished, tx.committed = true, true
  local rows, serr, state, pos = raw:sync()
  if rows == nil then return nil, serr, state, pos end
  return true
end

function Tx:query(sql, params)
  tx_check(self, "query")
  check_sql("query", sql, params)
  local raw = self.raw
  if not self.commit_next then return run_in(raw, sql, params) end
  local ticket, err = send_one(raw, sql, params, true)
  if not ticket then return nil, err end
  local ok, serr, state, pos = commit_round_trip(self)
  if not ok then return nil, serr, state, pos end
  return raw:kept(ticket)
end

-- tx:commit_with_next(): the transaction's next tx:query, or the first
-- read of a deferred result, also commits it: the COMMIT costs no round
-- trip of its own. The transaction takes no statement after that one;
-- what fn returns is still what the transaction returns, but an error fn
-- raises after the commit no longer rolls anything back.
function Tx:commit_with_next()
  tx_check(self, "commit_with_next")
  self.commit_next = true
end

-- tx:is_open() -> whether the transaction takes statements still (false
-- once its COMMIT went, after tx:commit_with_next, or it ended).
function Tx:is_open()
  return getmetatable(self) == Tx and not self.finished
end

-- tx:send(sql [, params]) -> true | nil, err: a statement whose results the
-- caller does not need. It goes to the server with the transaction's next
-- statement or its commit, in the same round trip; if it fails, that call
-- reports its error and the transaction rolls back.
function Tx:send(sql, params)
  tx_check(self, "send")
  check_sql("send", sql, params)
  return send_one(self.raw, sql, params)
end

-- tx:defer(sql [, params]) -> result | nil, err: a statement sent as with
-- tx:send, whose rows are kept: result() -> rows, count | nil, err, once
-- the transaction's next statement has run (result() runs the round trip
-- itself when none has). A failure fails that statement and the
-- transaction, as with tx:send; result() then returns nil, err.
function Tx:defer(sql, params)
  tx_check(self, "defer")
  check_sql("defer", sql, params)
  local raw = self.raw
  local ticket, err = send_one(raw, sql, params, true)
  if not ticket then return nil, err end
  return function()
    local rows, n = raw:kept(ticket)
    if rows == false then
      local ok, serr
      if self.commit_next and not self.finished then
        ok, serr = commit_round_trip(self)
      else
        ok, serr = raw:sync()
      end
      if not ok and serr ~= nil then return nil, serr end
      rows, n = raw:kept(ticket)
    end
    return rows, n
  end
end

function Tx:exec(sql)
  tx_check(self, "exec")
  check_sql("exec", sql)
  local raw = self.raw
  if raw:pending() > 0 then
    local ok, err, state = raw:sync()
    if not ok then return nil, err, state end
  end
  return raw:exec(sql)
end

-- After a failure inside a transaction: end what was sent, then roll back.
local function undo(raw, sp)
  if raw:pending() > 0 then raw:sync() end
  if raw:ok() or raw:tx_status() ~= "unknown" then
    if sp then
      raw:exec("ROLLBACK TO SAVEPOINT " .. sp)
      raw:exec("RELEASE SAVEPOINT " .. sp)
    else
      raw:exec("ROLLBACK")
    end
  end
end

-- Run fn(tx) inside a transaction on `raw`: commit on return, roll back on
-- error. `depth` > 0 uses a savepoint. The BEGIN (SAVEPOINT) goes with the
-- first statement, and statements sent with tx:send with the next one or
-- the COMMIT, so a transaction costs no round trip of its own.
local function run_tx(raw, fn, depth)
  local sp = depth > 0 and ("moongraph_sp_" .. depth) or nil
  local ok, err = raw:send(sp and ("SAVEPOINT " .. sp) or "BEGIN")
  if not ok then return nil, err end
  local tx = setmetatable({ raw = raw, depth = depth, sp = sp }, Tx)
  local res = pack(pcall(fn, tx))
  tx.finished = true
  if res[1] and raw:tx_status() == "inerror" then
    res = { false, "pg: transaction rolled back: a statement inside it failed", n = 2 }
  end
  if res[1] then
    -- (after tx:commit_with_next its end went with that round trip)
    if not tx.committed then
      ok, err = run_in(raw, end_sql(tx))
      if not ok then
        undo(raw, sp)
        return nil, err
      end
    end
    return unpack(res, 2, res.n)
  end
  -- a transaction already committed has nothing left to roll back, unless
  -- a statement of that last round trip failed and left it aborted
  if not tx.committed or raw:tx_status() == "inerror" then undo(raw, sp) end
  return nil, res[2]
end

-- tx:transaction(fn): a nested transaction (savepoint).
function Tx:transaction(fn)
  tx_check(self, "transaction")
  if type(fn) ~= "function" then
    error("bad argument #1 to 'transaction' (function expected)", 2)
  end
  return run_tx(self.raw, fn, self.depth + 1)
end

---------------------------------------------------------------- pools (and single connections)

local Pool = {}
Pool.__index = Pool

local function check_pool(self, fname)
  if getmetatable(self) ~= Pool then
    error(format("bad self to '%s' (pg connection or pool expected)", fname), 3)
  end
  if self.closed then return nil, errors.new("cancelled", "pg: connection closed") end
  return true
end

-- Take a turn on a slot; `guard` gives it back when the caller's scope
-- ends (also when the task is cancelled): a slot left inside a transaction
-- is closed rather than handed on.
local function take(self)
  local limit, why = self.cfg.acquire_timeout, ""
  local budget = loop.budget()
  if budget and (not limit or budget < limit) then
    limit, why = budget, ", at the caller's deadline"
  end
  local slot = gate_acquire(self.gate, limit)
  if not slot then
    return nil, errors.new("timeout", format("pg: no connection free after %gs (pool of %d)%s",
      limit or 0, self.gate.size, why), { retryable = true })
  end
  local guard = setmetatable({}, { __close = function()
    local raw = slot.raw
    if raw then raw:kept() end   -- rows of tx:defer nobody took
    if raw and raw:tx_status() ~= "idle" then
      raw:close()
      slot.raw = nil
    end
    if self.closed and slot.raw then
      slot.raw:close()
      slot.raw = nil
    end
    gate_release(self.gate, slot)
  end })
  return slot, guard
end

-- db:query(sql [, params]) -> rows, count | nil, err, sqlstate
function Pool:query(sql, params)
  local ok, cerr = check_pool(self, "query")
  check_sql("query", sql, params)
  if not ok then return nil, cerr end
  local slot, guard = take(self)
  if not slot then return nil, guard end
  local _ <close> = guard
  local raw, err = slot_raw(self.cfg, slot)
  if not raw then return nil, err end
  return run_query(raw, sql, params)
end

-- db:exec(sql) -> true | nil, err, sqlstate (several statements allowed)
function Pool:exec(sql)
  local ok, cerr = check_pool(self, "exec")
  check_sql("exec", sql)
  if not ok then return nil, cerr end
  local slot, guard = take(self)
  if not slot then return nil, guard end
  local _ <close> = guard
  local raw, err = slot_raw(self.cfg, slot)
  if not raw then return nil, err end
  return raw:exec(sql)
end

-- db:transaction(fn) -> fn's results after COMMIT | nil, err after ROLLBACK.
-- fn(tx) runs with the connection to itself: tx:query, tx:exec,
-- tx:transaction (savepoint). Other tasks wait for their turn meanwhile.
function Pool:transaction(fn)
  local ok, cerr = check_pool(self, "transaction")
  if type(fn) ~= "function" then
    error("bad argument #1 to 'transaction' (function expected)", 2)
  end
  if not ok then return nil, cerr end
  local slot, guard = take(self)
  if not slot then return nil, guard end
  local _ <close> = guard
  local raw, err = slot_raw(self.cfg, slot)
  if not raw then return nil, err end
  return run_tx(raw, fn, 0)
end

function Pool:close()
  if getmetatable(self) ~= Pool then error("bad self to 'close'", 2) end
  self.closed = true
  local idle = self.gate.idle
  for i = 1, #idle do
    if idle[i].raw then idle[i].raw:close() end
    idle[i].raw = nil
  end
end

Pool.__close = Pool.close

function Pool:__tostring()
  return format("pg %s (%d connection%s)%s", self.single and "connection" or "pool",
    self.gate.size, self.gate.size == 1 and "" or "s", self.closed and " closed" or "")
end

local function new_pool(fname, url, opts, size)
  if type(url) ~= "string" or url == "" then
    error(format("bad argument #1 to '%s' (connection URL or conninfo string expected)", fname), 3)
  end
  if opts ~= nil and type(opts) ~= "table" then
    error(format("bad argument #2 to '%s' (options table expected, got %s)", fname, type(opts)), 3)
  end
  opts = opts or {}
  for k, v in pairs(opts) do
    if k ~= "size" and k ~= "statement_timeout" and k ~= "connect_timeout" and k ~= "acquire_timeout" then
      error(format("bad argument #2 to '%s' (unknown option '%s')", fname, tostring(k)), 3)
    end
    if type(v) ~= "number" or v < 0 then
      error(format("bad argument #2 to '%s' (option '%s' must be a non-negative number)", fname, k), 3)
    end
  end
  size = size or opts.size or 4
  if math.type(size) ~= "integer" or size < 1 then
    error(format("bad argument #2 to '%s' (size must be a positive integer)", fname), 3)
  end
  local cfg = {
    url = url,
    statement_timeout = opts.statement_timeout,
    connect_timeout = opts.connect_timeout or 10,
    acquire_timeout = opts.acquire_timeout,
  }
  local gate = { idle = {}, waiters = {}, made = 0, size = size }
  gate.make = function() return {} end
  return setmetatable({ cfg = cfg, gate = gate, closed = false }, Pool)
end

-- pg.pool(url [, {size=4, statement_timeout=, connect_timeout=10, acquire_timeout=}])
-- Connections open on first use; each runs one statement at a time and
-- waiting tasks are served in arrival order.
function _M.pool(url, opts)
  return new_pool("pool", url, opts)
end

-- pg.connect(url [, {statement_timeout=, connect_timeout=10}]) -> db | nil, err
-- One connection, opened now so a bad address or credentials show here.
function _M.connect(url, opts)
  if opts and opts.size then
    error("bad argument #2 to 'connect' (size is an option of pg.pool)", 2)
  end
  local db = new_pool("connect", url, opts, 1)
  db.single = true
  local slot = db.gate.make()
  local raw, err = slot_raw(db.cfg, slot)
  if not raw then return nil, err end
  db.gate.made = 1
  db.gate.idle[1] = slot
  return db
end

return _M
