-- The data tools of the store-marketing pipeline (the seed's MCP tools),
-- over a dataset backend:
--
--   search_merchant(name)        -> {found, merchants}
--   load_store_data(store_id)    -> {success, data} | {success = false, error}
--   resolve_region(district)     -> {success, admin_dong_code} | {success = false, error}
--   load_area_data(code)         -> {success, data} | {success = false, error}
--   load_region_data(code)       -> {success, data} | {success = false, error}
--
-- tools.new(backend) binds them to a backend; tools.local_backend(dir)
-- reads the sample JSON files of data/marketing/ (every answer carries
-- sample = true). A backend is a table of the five lookups returning plain
-- values (see local_backend), so a database can stand in for the files.

local json = require "cjson.safe"

local _M = {}

local function default_dir()
  local src = debug.getinfo(1, "S").source
  local path = src:sub(1, 1) == "@" and src:sub(2) or ""
  local root = path:match("^(.*)/scripts/marketing/tools%.lua$") or "."
  return root .. "/data/marketing"
end

-- normalise a store name for comparison: lower case, no spaces or punctuation
function _M.norm(s)
  return (tostring(s or ""):lower():gsub("[%s%p]", ""))
end

--[[ local_backend(dir) -> backend over the JSON files in dir (default
data/marketing/). Files are read through the runtime's file store on first
use and kept. ]]
function _M.local_backend(dir)
  dir = dir or default_dir()
  local cache = {}
  local function load(name)
    if cache[name] then return cache[name] end
    local text, err = require("moongraph.core").store.read(dir .. "/" .. name)
    if not text then return nil, "cannot read " .. dir .. "/" .. name .. ": " .. tostring(err) end
    local v = json.decode(text)
    if type(v) ~= "table" then return nil, "malformed JSON in " .. dir .. "/" .. name end
    cache[name] = v
    return v
  end
  local b = { dir = dir, sample = true }
  function b.merchants()
    local f, err = load("merchants.json")
    if not f then return nil, err end
    return f.merchants
  end
  function b.card(store_id)
    local f, err = load("card_data.json")
    if not f then return nil, err end
    return f.stores[store_id] or false
  end
  function b.region_code(district)
    local f, err = load("regions.json")
    if not f then return nil, err end
    return f.regions[district] or false
  end
  function b.area(code)
    local f, err = load("area_data.json")
    if not f then return nil, err end
    return f.areas[code] or false
  end
  function b.region(code)
    local f, err = load("region_data.json")
    if not f then return nil, err end
    return f.regions[code] or false
  end
  function b.notice()
    local f = load("merchants.json")
    return f and f.notice or nil
  end
  return b
end

local function copy(t)
  if type(t) ~= "table" then return t end
  local out = {}
  for k, v in pairs(t) do out[k] = copy(v) end
  return out
end

--[[ new(backend) -> tools ]]
function _M.new(backend)
  backend = backend or _M.local_backend()
  local T = { backend = backend }

  -- every merchant whose name or brand contains the query (normalised)
  function T.search_merchant(merchant_name)
    local q = _M.norm(merchant_name)
    if q == "" then return { found = false, merchants = {} } end
    local list, err = backend.merchants()
    if not list then return { found = false, merchants = {}, error = err } end
    local out = {}
    for _, m in ipairs(list) do
      if _M.norm(m.name):find(q, 1, true) or _M.norm(m.brand):find(q, 1, true) then
        local c = copy(m)
        c.sample = backend.sample or nil
        out[#out + 1] = c
      end
    end
    return { found = #out > 0, merchants = out }
  end

  local function lookup(fn, key, what)
    local v, err = fn(key)
    if v == nil then return { success = false, error = err } end
    if v == false then return { success = false, error = what .. " '" .. tostring(key) .. "' not found" } end
    local d = copy(v)
    if backend.sample then d.sample = true end
    return { success = true, data = d }
  end

  function T.load_store_data(store_id) return lookup(backend.card, store_id, "card data of store") end
  function T.load_area_data(code) return lookup(backend.area, code, "area data of") end
  function T.load_region_data(code) return lookup(backend.region, code, "region data of") end

  function T.resolve_region(district)
    local code, err = backend.region_code(district)
    if code == nil then return { success = false, error = err } end
    if code == false then return { success = false, error = "no administrative code for '" .. tostring(district) .. "'" } end
    return { success = true, admin_dong_code = code }
  end

  return T
end

return _M
