-- moongraph.worker.scripts — the pipelines a worker runs, and reloading them.
--
-- A script is a Lua module file (e.g. scripts/eco/chat.lua) that returns a
-- table with:
--
--   build{ checkpointer = saver } -> compiled graph        (required)
--   input(message, { location = ... }) -> input table     (optional)
--   worker_input(job, memory) -> input table              (optional: replaces
--                                                          the default below)
--   worker_result(state) -> answer, state_to_store        (optional)
--
-- The default input is input(message, {location}) (or {message=,
-- user_location=}) plus what memory knows about the conversation: `intent`
-- (the previous turn's intent), `turn`, `messages` (recent turns) and
-- `summary`. The default result is state.answer, and the state without
-- `messages` and `summary` (those live in the conversation memory).
--
--   local reg = scripts.new({ {name = "chat", path = "scripts/eco/chat.lua"} }, saver)
--   assert(reg:load())             -- nil, err when a script fails to load or build
--   local s = reg:get("chat")      -- or reg:get(nil): the first; s.app, s.module
--   reg:reload()                   -- load everything again; on failure keep the old set
--
-- Modules are loaded with require (from package.path, which starts with the
-- working directory), and reload forgets every module the scripts loaded
-- (nodes, rules, data helpers), so edited files take effect. Runs already
-- going keep the graph they started with.

local type, tostring, pairs, ipairs, pcall, setmetatable, require =
  type, tostring, pairs, ipairs, pcall, setmetatable, require

local _M = {}
local Reg = {}
Reg.__index = Reg

-- Modules that belong to the runtime and are never unloaded.
local function runtime_module(name)
  return name == "moongraph" or name:match("^moongraph%.") or name:match("^cjson")
    or name == "_G" or name == "package" or name == "coroutine" or name == "table"
    or name == "io" or name == "os" or name == "string" or name == "math"
    or name == "utf8" or name == "debug"
end

-- "scripts/eco/chat.lua" -> "scripts.eco.chat"
function _M.module_name(path)
  local p = path:gsub("^%./", ""):gsub("%.lua$", "")
  if p:find("^/") or p:find("%.%.") then return nil end
  return (p:gsub("/", "."))
end

function _M.new(specs, saver)
  return setmetatable({ specs = specs, saver = saver, set = nil, loaded = {}, generation = 0 }, Reg)
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
    local bok, app = pcall(mod.build, { checkpointer = self.saver })
    if not bok then return fail("script '" .. spec.name .. "': build failed: " .. tostring(app)) end
    if type(app) ~= "table" or type(app.stream) ~= "function" then
      return fail("script '" .. spec.name .. "': build did not return a compiled graph")
    end
    local s = { name = spec.name, path = spec.path, module = mod, app = app }
    set.list[#set.list + 1] = s
    set.by_name[spec.name] = s
    set.by_name[spec.path] = s
  end
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

-- reload() -> true | nil, err (the scripts loaded before stay in use)
function Reg:reload()
  local saved = {}
  for name in pairs(self.loaded) do
    saved[name] = package.loaded[name]
    package.loaded[name] = nil
  end
  local set, mine = load_set(self)
  if not set then
    for name, v in pairs(saved) do package.loaded[name] = v end
    return nil, mine
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

return _M
