--[[
moongraph.service.files — the service's storage in local files (one
process): thread and run records under a data directory, the threads'
checkpoints beside them.

  local files = require "moongraph.service.files"
  local st = assert(files.open(".moongraph"))
  st.saver   -- the checkpoint saver of the threads (moongraph.checkpoint.file)

Layout of the data directory:

  <data>/checkpoints/...          the threads' checkpoints
  <data>/threads/<thread>.json    thread records: owner, metadata, status, values, ...
  <data>/runs/<run>.json          run records; a finished run's file holds its events too

Every record is written durably (core.files: temp file, fsync, rename)
and indexed in memory, so reads cost no I/O; a change is made in memory
first, so two runs admitted at once cannot both find their thread free.
Directories written by earlier versions (threads and checkpoints, no runs)
are read as they are. The operations are moongraph.service's storage
interface (see moongraph.service.postgres for the same over PostgreSQL).
]]

local mg = require "moongraph"
local core = require "moongraph.core"
local json = require "moongraph.json"
local lgstate = require "moongraph.api.langgraph_state"
local lgrun = require "moongraph.langgraph_run"
local paths = require "moongraph.paths"

local type, pairs, ipairs, tostring, setmetatable, error = type, pairs, ipairs, tostring, setmetatable, error
local table_sort, table_remove = table.sort, table.remove

local files = core.files
local contains = lgstate.contains
local wall = lgrun.wall

local _M = {}
local F = {}
F.__index = F

local ACTIVE = { pending = true, running = true }

local function active_of(list, except)
  local pending
  for _, r in ipairs(list) do
    if r.run_id ~= except then
      if r.status == "running" then return r end
      if r.status == "pending" and not pending then pending = r end
    end
  end
  return pending
end

local component = paths.component

local THREAD_FIELDS = { "thread_id", "owner", "created_at", "updated_at", "metadata", "status", "values",
  "interrupts", "error" }
local RUN_FIELDS = { "run_id", "thread_id", "owner", "assistant_id", "status", "multitask_strategy", "metadata",
  "kwargs", "stateless", "temporary", "executor", "output", "error", "created_at", "updated_at" }

local function pick(rec, fields)
  local out = {}
  for _, k in ipairs(fields) do out[k] = rec[k] end
  return out
end

local function read_json(path)
  local body = files.read(path)
  local v = body and json.decode(body)
  return type(v) == "table" and v or nil
end

-- open(dir) -> storage | nil, err
function _M.open(dir)
  if type(dir) ~= "string" or dir == "" then error("bad argument #1 to 'open' (a data directory expected)", 2) end
  dir = dir:gsub("/+$", "")
  for _, sub in ipairs { "threads", "runs" } do
    local ok, err = files.mkdir(dir .. "/" .. sub)
    if not ok then return nil, "cannot create " .. dir .. "/" .. sub .. ": " .. tostring(err) end
  end
  local self = setmetatable({ dir = dir, saver = mg.checkpoint.file(dir .. "/checkpoints"),
    threads = {}, runs = {}, by_thread = {}, stateless = {} }, F)
  for _, kind in ipairs { "threads", "runs" } do
    local names, err, code = files.list(dir .. "/" .. kind)
    if not names and code ~= "ENOENT" then return nil, err end
    for _, n in ipairs(names or {}) do
      if n:match("%.json$") then
        local rec = read_json(dir .. "/" .. kind .. "/" .. n)
        if rec and kind == "threads" and type(rec.thread_id) == "string" then
          rec.owner = rec.owner or ""
          rec.metadata = type(rec.metadata) == "table" and rec.metadata or {}
          self.threads[rec.thread_id] = rec
        elseif rec and kind == "runs" and type(rec.run_id) == "string" then
          rec.has_events, rec.events = rec.events ~= nil, nil
          self.runs[rec.run_id] = rec
        end
      end
    end
  end
  -- each thread's runs, oldest first
  local list = {}
  for _, r in pairs(self.runs) do list[#list + 1] = r end
  table_sort(list, function(a, b)
    if a.created_at == b.created_at then return a.run_id < b.run_id end
    return (a.created_at or 0) < (b.created_at or 0)
  end)
  for _, r in ipairs(list) do self:_index(r) end
  -- a thread left busy with no run going (a directory of an earlier
  -- version, whose runs were not stored) is idle
  for id, th in pairs(self.threads) do
    if th.status == "busy" and not active_of(self:_runs_of(id)) then th.status = "idle" end
  end
  return self
end

function F:close() end

-- by_thread[thread_id]: each thread's runs, oldest first; stateless: the
-- stateless runs, oldest first (kept up to a count of their own)
function F:_index(r)
  local l = self.by_thread[r.thread_id]
  if not l then l = {}; self.by_thread[r.thread_id] = l end
  l[#l + 1] = r
  if r.stateless then self.stateless[#self.stateless + 1] = r end
end

local function drop(l, r)
  for i, x in ipairs(l) do
    if x == r then table_remove(l, i) return end
  end
end

function F:_unindex(r)
  local l = self.by_thread[r.thread_id]
  if l then
    drop(l, r)
    if not l[1] then self.by_thread[r.thread_id] = nil end
  end
  if r.stateless then drop(self.stateless, r) end
end

function F:_thread_path(id) return self.dir .. "/threads/" .. component(id) .. ".json" end
function F:_run_path(id) return self.dir .. "/runs/" .. component(id) .. ".json" end

function F:_save_thread(rec)
  local s, err = json.encode(pick(rec, THREAD_FIELDS))
  if not s then return nil, "thread " .. rec.thread_id .. ": " .. tostring(err) end
  return files.write(self:_thread_path(rec.thread_id), s)
end

-- A run's file: its record, and a finished run's events with their data
-- as the JSON they already are (spliced in, not encoded again).
function F:_save_run(rec, events)
  -- (the file is read back by this module only: bytes are kept as they are,
  -- and moongraph.json's C encoder writes it)
  local s, err = json.encode(pick(rec, RUN_FIELDS))
  if not s then return nil, "run " .. rec.run_id .. ": " .. tostring(err) end
  if events then
    local parts = {}
    for i, e in ipairs(events) do
      parts[i] = '{"seq":' .. e.seq .. ',"event":' .. json.encode(e.event) .. ',"data":' .. e.data .. "}"
    end
    s = s:sub(1, -2) .. (s == "{}" and "" or ",") .. '"events":[' .. table.concat(parts, ",") .. "]}"
  end
  return files.write(self:_run_path(rec.run_id), s)
end

-- the runs of a thread, oldest first
function F:_runs_of(thread_id) return self.by_thread[thread_id] or {} end

---------------------------------------------------------------- threads

function F:thread(id)
  return self.threads[id] or false
end

-- thread_insert(rec) -> the stored record | false (the id exists)
function F:thread_insert(rec)
  if self.threads[rec.thread_id] then return false end
  self.threads[rec.thread_id] = rec
  local ok, err = self:_save_thread(rec)
  if not ok then
    self.threads[rec.thread_id] = nil
    return nil, err
  end
  return rec
end

function F:thread_merge_metadata(id, owner, metadata)
  local rec = self.threads[id]
  if not rec or rec.owner ~= owner then return false end
  for k, v in pairs(metadata) do rec.metadata[k] = v end
  rec.updated_at = wall()
  local ok, err = self:_save_thread(rec)
  if not ok then return nil, err end
  return rec
end

-- thread_search(owner, q) -> the page of records, the total
function F:thread_search(owner, q)
  local want_ids
  if q.ids then
    want_ids = {}
    for _, i in ipairs(q.ids) do want_ids[i] = true end
  end
  local list = {}
  for _, rec in pairs(self.threads) do
    if rec.owner == owner and (q.status == nil or rec.status == q.status)
       and (not want_ids or want_ids[rec.thread_id])
       and contains(rec.metadata or {}, q.metadata) and contains(rec.values or {}, q.values) then
      list[#list + 1] = rec
    end
  end
  local offset, limit = q.offset or 0, q.limit or 10
  if limit == 0 then return {}, #list end   -- (a count)
  local sort_by = q.sort_by or "created_at"
  local desc = q.sort_order ~= "asc"
  table_sort(list, function(a, b)
    local x, y = a[sort_by], b[sort_by]
    if x == y then x, y = a.thread_id, b.thread_id end
    if desc then return x > y end
    return x < y
  end)
  local page = {}
  for i = offset + 1, math.min(#list, offset + limit) do page[#page + 1] = list[i] end
  return page, #list
end

-- thread_set(id, {values, interrupts, status, error, except_run}): values
-- nil keeps them; the status is busy while another run is going
function F:thread_set(id, f)
  local rec = self.threads[id]
  if not rec then return true end
  if f.values ~= nil then rec.values = f.values end
  rec.interrupts = f.interrupts or {}
  rec.status = active_of(self:_runs_of(id), f.except_run) and "busy" or f.status or "idle"
  rec.error = f.error
  rec.updated_at = wall()
  return self:_save_thread(rec)
end

-- thread_delete(id, owner) -> the ids of its runs that were going | false
-- (no such thread of the owner)
function F:thread_delete(id, owner)
  local rec = self.threads[id]
  if not rec or rec.owner ~= owner then return false end
  local going = {}
  local list = self:_runs_of(id)
  self.threads[id] = nil
  for _, r in ipairs(list) do
    if ACTIVE[r.status] then going[#going + 1] = r.run_id end
    self.runs[r.run_id] = nil
    if r.stateless then drop(self.stateless, r) end
  end
  self.by_thread[id] = nil
  for _, r in ipairs(list) do files.remove(self:_run_path(r.run_id)) end
  local ok, err, code = files.remove(self:_thread_path(id))
  if not ok and code ~= "ENOENT" then return nil, err end
  return going
end

---------------------------------------------------------------- runs

--[[ run_admit(rec, {graph, reject}) -> true | false, why, detail | nil, err
why: "missing" (no thread of rec.owner), "graph" (the thread is another
graph's: detail), "busy" (reject and a run of it is going). Binds the
thread to the graph and marks it busy; a temporary run has no thread
record. ]]
function F:run_admit(rec, o)
  local th
  if not rec.temporary then
    th = self.threads[rec.thread_id]
    if not th or th.owner ~= rec.owner then return false, "missing" end
    local gid = th.metadata.graph_id
    if gid ~= nil and gid ~= o.graph then return false, "graph", gid end
    if o.reject and active_of(self:_runs_of(rec.thread_id)) then return false, "busy" end
  end
  self.runs[rec.run_id] = rec
  self:_index(rec)
  local bound
  if th then
    if th.metadata.graph_id == nil then
      th.metadata.graph_id, th.metadata.assistant_id, bound = o.graph, o.graph, true
    end
    th.status, th.updated_at = "busy", rec.created_at
  end
  local ok, err = self:_save_run(rec)
  if ok and bound then ok, err = self:_save_thread(th) end
  if not ok then
    self.runs[rec.run_id] = nil
    self:_unindex(rec)
    return nil, err
  end
  return true
end

function F:run(id) return self.runs[id] or false end

-- thread_runs(thread_id, {status, offset, limit}) -> records, newest first
function F:thread_runs(thread_id, q)
  local list, out, n = self:_runs_of(thread_id), {}, 0
  for i = #list, 1, -1 do
    local r = list[i]
    if q.status == nil or r.status == q.status then
      n = n + 1
      if n > (q.offset or 0) and #out < (q.limit or 10) then out[#out + 1] = r end
    end
  end
  return out
end

-- the thread's running (else first pending) run | false
function F:run_active(thread_id) return active_of(self:_runs_of(thread_id)) or false end

--[[ run_set(id, fields [, from]) -> true | false (not in a status of the
set `from`, or gone) | nil, err. fields: status, output, error, events
(the run's event log, kept in its file). ]]
function F:run_set(id, fields, from)
  local rec = self.runs[id]
  if not rec or (from and not from[rec.status]) then return false end
  for k, v in pairs(fields) do
    if k ~= "events" then rec[k] = v end
  end
  rec.updated_at = wall()
  if fields.events then rec.has_events = true end
  return self:_save_run(rec, fields.events)
end

-- run_started(id): the run is running (in memory only: after a restart,
-- a run left pending and one left running are settled alike)
function F:run_started(id)
  local rec = self.runs[id]
  if rec and rec.status == "pending" then rec.status, rec.updated_at = "running", wall() end
  return true
end

-- run_events(id) -> the stored event log of a finished run | false
function F:run_events(id)
  local rec = self.runs[id]
  if not rec or not rec.has_events then return false end
  local v = read_json(self:_run_path(id))
  if not v or type(v.events) ~= "table" then return false end
  -- (their data was valid UTF-8 when it was published)
  for _, e in ipairs(v.events) do e.data = json.encode(e.data) end
  return v.events
end

function F:run_delete(id)
  local rec = self.runs[id]
  if not rec then return true end
  self.runs[id] = nil
  self:_unindex(rec)
  local ok, err, code = files.remove(self:_run_path(id))
  if not ok and code ~= "ENOENT" then return nil, err end
  return true
end

-- runs_prune(thread_id | nil (stateless runs), keep): the oldest finished
-- runs over keep go
function F:runs_prune(thread_id, keep)
  local list = thread_id and self:_runs_of(thread_id) or self.stateless
  local over = #list - keep
  local i = 1
  while over > 0 and list[i] do
    local r = list[i]
    if not ACTIVE[r.status] then
      self:run_delete(r.run_id)
      over = over - 1
    else
      i = i + 1
    end
  end
  return true
end

-- runs_unfinished(executor) -> records of runs still pending or running
-- (what a process that stopped left; one process owns a data directory)
function F:runs_unfinished()
  local out = {}
  for _, r in pairs(self.runs) do
    if ACTIVE[r.status] then out[#out + 1] = r end
  end
  table_sort(out, function(a, b) return (a.created_at or 0) < (b.created_at or 0) end)
  return out
end

return _M
