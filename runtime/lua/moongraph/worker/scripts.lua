-- moongraph.worker.scripts — the pipelines a worker runs, their hooks, and
-- reloading them.
--
-- A script is a Lua module file that returns a table with
--
--   build{ checkpointer = saver } -> compiled graph        (required)
--   worker = { ... }                                       (optional hooks)
--
-- and the hooks (every one optional; docs/worker.md has the contract):
--
--   scope       a name for the script's own schema (required with migrations)
--   migrations  { {version=, name=, sql= | run=}, ... }: its Postgres schema, applied
--               at start and on reload by moongraph.worker.migrations
--   input(job, env) -> run input | nil, err        for a new run (default job.input)
--   result(state, job) -> { answer=, state=, event= }   what is stored
--   record(tx, job, state, result, env) -> true | nil, err
--               in the transaction that stores the result, once per job
--   committed(job, state, result, env) -> true | nil, err   after that commit
--   forget(job, env) -> true | nil, err     a duplicate delivery found the result
--   erase(thread_id, env) -> true | nil, err   a conversation deleted through the
--               Chat API (serve --redis --pg): what the script keeps of the thread
--
--   local reg = scripts.new({ {name = "app", path = "scripts/app/main.lua"} }, saver)
--   assert(reg:load())             -- nil, err when a script fails to load, build or check
--   local s = reg:get("app")       -- or reg:get(nil): the first; s.app, s.module, s.hooks
--   reg:scopes()                   -- the migration scopes of the scripts: { {scope=, list=}, ... }
--   reg:reload(check)              -- load everything again; check(set) may refuse the new
--                                  -- set (nil, err); on failure keep the old set
--
-- Modules are loaded with require (from package.path, which starts with the
-- working directory), and reload forgets every module the scripts loaded
-- (nodes, rules, data helpers), so edited files take effect. Runs already
-- going keep the graph and hooks they started with.

local migrations = require "moongraph.worker.migrations"

local type, tostring, pairs, ipairs, pcall, setmetatable, require =
  type, tostring, pairs, ipairs, pcall, setmetatable, require
local table_sort, table_concat = table.sort, table.concat

local _M = {}
local Reg = {}
Reg.__index = Reg

_M.HOOKS = { "prefetch", "input", "result", "record", "committed", "forget", "erase" }
local KNOWN = { scope = true, migrations = true }
for _, h in ipairs(_M.HOOKS) do KNOWN[h] = true end

-- Modules that belong to the runtime and are never unloaded.
local function runtime_module(name)
  return name == "moongraph" or name:match("^moongraph%.") or name:match("^cjson")
    or name == "_G" or name == "package" or name == "coroutine" or name == "table"
    or name == "io" or name == "os" or name == "string" or name == "math"
    or name == "utf8" or name == "debug"
end

-- "scripts/app/main.lua" -> "scripts.app.main"
function _M.module_name(path)
  local p = path:gsub("^%./", ""):gsub("%.lua$", "")
  if p:find("^/") or p:find("%.%.") then return nil end
  return (p:gsub("/", "."))
end

-- hooks(mod) -> the module's worker hooks (a table, maybe empty) | nil, err
function _M.hooks(mod)
  for _, old in ipairs { "worker_input", "worker_result" } do
    if mod[old] ~= nil then
      return nil, old .. " is no longer called: the worker's hooks are the table `worker` "
        .. "(worker.input, worker.result; docs/worker.md)"
    end
  end
  local w = mod.worker
  if w == nil then return {} end
  if type(w) ~= "table" then return nil, "`worker` must be a table of hooks, got " .. type(w) end
  local unknown = {}
  for k in pairs(w) do
    if not KNOWN[k] then unknown[#unknown + 1] = tostring(k) end
  end
  if #unknown > 0 then
    table_sort(unknown)
    return nil, "worker." .. table_concat(unknown, ", worker.") .. ": not a hook (the hooks are scope, "
      .. "migrations, " .. table_concat(_M.HOOKS, ", ") .. ")"
  end
  for _, h in ipairs(_M.HOOKS) do
    if w[h] ~= nil and type(w[h]) ~= "function" then
      return nil, "worker." .. h .. " must be a function, got " .. type(w[h])
    end
  end
  if w.migrations ~= nil then
    if w.scope == nil then return nil, "worker.migrations needs worker.scope (the name of the script's schema)" end
    local ok, err = migrations.check(w.scope, w.migrations)
    if not ok then return nil, "worker: " .. err end
    if w.scope == migrations.SCOPE then
      return nil, "worker.scope '" .. migrations.SCOPE .. "' is the worker's own; take another name"
    end
  end
  return w
end

function _M.new(specs, saver)
  return setmetatable({ specs = specs, saver = saver, set = nil, loaded = {}, generation = 0 }, Reg)
end

local function same_list(a, b)
  if a == b then return true end
  if #a ~= #b then return false end
  for i = 1, #a do
    -- a run step (Lua) is known by its version and name: each script may hold its own copy of the function
    if a[i].version ~= b[i].version or a[i].name ~= b[i].name or a[i].sql ~= b[i].sql
        or (a[i].run == nil) ~= (b[i].run == nil) then
      return false
    end
  end
  return true
end

-- The migration scopes of a set (one entry per scope) | nil, err.
local function scopes_of(set)
  local out, by = {}, {}
  for _, s in ipairs(set.list) do
    local w = s.hooks
    if w.migrations then
      local prev = by[w.scope]
      if prev then
        if not same_list(prev.list, w.migrations) then
          return nil, ("scripts '%s' and '%s' declare different migrations for scope '%s'")
            :format(prev.script, s.name, w.scope)
        end
      else
        local e = { scope = w.scope, list = w.migrations, script = s.name }
        by[w.scope] = e
        out[#out + 1] = e
      end
    end
  end
  return out
end

local function load_set(self)
  local before = {}
  for name in pairs(package.loaded) do before[name] = true end
  local set = { list = {}, by_name = {} }
  local function fail(msg)
    -- forget what this attempt loaded, so a later attempt starts clean
    for name in pairs(package.loaded) do
      if not before[name] and not runtime_module(name) then package.loaded[name] = nil end
    end
    return nil, msg
  end
  for _, spec in ipairs(self.specs) do
    local modname = _M.module_name(spec.path)
    local ok, mod
    if modname and package.searchpath(modname, package.path) then
      ok, mod = pcall(require, modname)
    else
      local chunk, lerr = loadfile(spec.path)
      if not chunk then return fail("script '" .. spec.name .. "': " .. tostring(lerr)) end
      ok, mod = pcall(chunk)
    end
    if not ok then return fail("script '" .. spec.name .. "' (" .. spec.path .. "): " .. tostring(mod)) end
    if type(mod) ~= "table" or type(mod.build) ~= "function" then
      return fail("script '" .. spec.name .. "' (" .. spec.path .. ") does not return a table with build(opts)")
    end
    local hooks, herr = _M.hooks(mod)
    if not hooks then return fail("script '" .. spec.name .. "' (" .. spec.path .. "): " .. herr) end
    local bok, app = pcall(mod.build, { checkpointer = self.saver })
    if not bok then return fail("script '" .. spec.name .. "': build failed: " .. tostring(app)) end
    if type(app) ~= "table" or type(app.stream) ~= "function" then
      return fail("script '" .. spec.name .. "': build did not return a compiled graph")
    end
    local s = { name = spec.name, path = spec.path, module = mod, app = app, hooks = hooks }
    set.list[#set.list + 1] = s
    set.by_name[spec.name] = s
    set.by_name[spec.path] = s
  end
  local scopes, serr = scopes_of(set)
  if not scopes then return fail(serr) end
  set.scopes = scopes
  local mine = {}
  for name in pairs(package.loaded) do
    if not before[name] and not runtime_module(name) then mine[#mine + 1] = name end
  end
  return set, mine
end

function Reg:load()
  local set, mine = load_set(self)
  if not set then return nil, mine end
  self.set = set
  for _, n in ipairs(mine) do self.loaded[n] = true end
  self.generation = self.generation + 1
  return true
end

-- reload([check]) -> true | nil, err (the scripts loaded before stay in use)
-- check(set) -> true | nil, err runs before the new set is taken (the
-- worker applies the new set's migrations there).
function Reg:reload(check)
  local saved = {}
  for name in pairs(self.loaded) do
    saved[name] = package.loaded[name]
    package.loaded[name] = nil
  end
  local set, mine = load_set(self)
  if set and check then
    local ok, cok, cerr = pcall(check, set)
    if not ok or not cok then
      for _, n in ipairs(mine) do package.loaded[n] = nil end
      set, mine = nil, ok and cerr or cok
    end
  end
  if not set then
    for name, v in pairs(saved) do package.loaded[name] = v end
    return nil, tostring(mine)
  end
  self.set = set
  self.loaded = {}
  for _, n in ipairs(mine) do self.loaded[n] = true end
  self.generation = self.generation + 1
  return true
end

-- get(name) -> script | nil (name nil: the first script)
function Reg:get(name)
  if name == nil then return self.set.list[1] end
  return self.set.by_name[name]
end

function Reg:names()
  local out = {}
  for i, s in ipairs(self.set.list) do out[i] = s.name end
  return out
end

-- The migration scopes of the loaded scripts (for migrations.migrate).
function Reg:scopes(set)
  return (set or self.set).scopes
end

return _M
