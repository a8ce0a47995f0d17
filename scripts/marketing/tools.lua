-- The data tools of the store-marketing pipeline (the seed's MCP tools),
-- over a dataset backend:
--
--   search_merchant(name)        -> {found, merchants}
--   load_store_data(store_id)    -> {success, data} | {success = false, error}
--   resolve_region(district)     -> {success, admin_dong_code} | {success = false, error}
--   load_area_data(code)         -> {success, data} | {success = false, error}
--   load_region_data(code)       -> {success, data} | {success = false, error}
--
-- tools.new(backend) binds them to a backend: tools.local_backend(dir)
-- reads the sample JSON files of data/marketing/ (every answer carries
-- sample = true); tools.pg_backend(url) reads the same data from
-- PostgreSQL tables (load_sample_into_pg fills them). A backend is a table
-- of lookups returning plain values, false for "not found", nil, err on
-- failure.
--
-- This file is also an MCP server: `moongraph mcp serve
-- scripts/marketing/tools.lua` serves the five tools (see _M.mcp below) over
-- a backend chosen from the environment as the pipeline chooses it
-- (MARKETING_PG_URL, else MARKETING_DATA_DIR or data/marketing/). The
-- pipeline calls them that way by default (scripts/marketing/mcp_tools.lua).

local json = require "cjson.safe"
local paths = require "moongraph.paths"

local _M = {}

local function default_dir()
  return paths.find("data/marketing") or "data/marketing"
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

---------------------------------------------------------------------------
-- PostgreSQL

_M.PG_SCHEMA = [[
CREATE TABLE IF NOT EXISTS marketing_merchants (
  store_id text PRIMARY KEY, name text NOT NULL, brand text NOT NULL DEFAULT '',
  category text NOT NULL DEFAULT '', district text NOT NULL DEFAULT '', address text NOT NULL DEFAULT '',
  sample boolean NOT NULL DEFAULT false);
CREATE TABLE IF NOT EXISTS marketing_card_data (store_id text PRIMARY KEY, data jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS marketing_regions (district text PRIMARY KEY, admin_dong_code text NOT NULL);
CREATE TABLE IF NOT EXISTS marketing_area_data (admin_dong_code text PRIMARY KEY, data jsonb NOT NULL);
CREATE TABLE IF NOT EXISTS marketing_region_data (admin_dong_code text PRIMARY KEY, data jsonb NOT NULL);
]]

--[[ pg_backend(db_or_url) -> backend over the tables of PG_SCHEMA.
db_or_url: a moongraph.pg connection or pool, or a URL (connected on first
use). A row's `sample` column (merchants) and a `sample` field in the jsonb
documents mark sample data, as load_sample_into_pg writes them. ]]
function _M.pg_backend(db_or_url)
  local db = type(db_or_url) ~= "string" and db_or_url or nil
  local url = type(db_or_url) == "string" and db_or_url or nil
  local function conn()
    if db then return db end
    local pg = require "moongraph.pg"
    local c, err = pg.connect(url)
    if not c then return nil, "cannot connect to the marketing database: " .. tostring(err) end
    db = c
    return db
  end
  local function rows(sql, params)
    local c, err = conn()
    if not c then return nil, err end
    local r, qerr = c:query(sql, params)
    if not r then return nil, "marketing database: " .. tostring(qerr) end
    return r
  end
  local function doc(sql, key)
    local r, err = rows(sql, { key })
    if not r then return nil, err end
    if not r[1] then return false end
    return r[1].data
  end
  local b = { sample = false }
  function b.merchants()
    local r, err = rows("SELECT store_id, name, brand, category, district, address, sample " ..
      "FROM marketing_merchants ORDER BY store_id")
    if not r then return nil, err end
    for _, m in ipairs(r) do if m.sample == false then m.sample = nil end end
    return r
  end
  function b.card(id) return doc("SELECT data FROM marketing_card_data WHERE store_id = $1", id) end
  function b.area(code) return doc("SELECT data FROM marketing_area_data WHERE admin_dong_code = $1", code) end
  function b.region(code) return doc("SELECT data FROM marketing_region_data WHERE admin_dong_code = $1", code) end
  function b.region_code(district)
    local r, err = rows("SELECT admin_dong_code FROM marketing_regions WHERE district = $1", { district })
    if not r then return nil, err end
    return r[1] and r[1].admin_dong_code or false
  end
  return b
end

--[[ load_sample_into_pg(db [, dir]) -> true | nil, err
Creates the tables of PG_SCHEMA and loads the JSON dataset of dir (default
data/marketing/) into them in one transaction, keeping its sample marks. ]]
function _M.load_sample_into_pg(db, dir)
  local src = _M.local_backend(dir)
  local merchants, err = src.merchants()
  if not merchants then return nil, err end
  local ok, e = db:exec(_M.PG_SCHEMA)
  if not ok then return nil, e end
  local store = require("moongraph.core").store
  local function file(name)
    local text, rerr = store.read(src.dir .. "/" .. name)
    if not text then return nil, rerr end
    return json.decode(text)
  end
  local cards, regions, areas, region_data = file("card_data.json"), file("regions.json"),
    file("area_data.json"), file("region_data.json")
  if not (cards and regions and areas and region_data) then return nil, "cannot read the dataset in " .. src.dir end
  local function mark(d)
    if cards.sample then d.sample = true end
    return d
  end
  local tok, terr = pcall(db.transaction, db, function(tx)
    local function q(sql, params)
      local r, qerr = tx:query(sql, params)
      if not r then error(qerr, 0) end
    end
    for _, m in ipairs(merchants) do
      q("INSERT INTO marketing_merchants (store_id, name, brand, category, district, address, sample) " ..
        "VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (store_id) DO UPDATE SET name = EXCLUDED.name, " ..
        "brand = EXCLUDED.brand, category = EXCLUDED.category, district = EXCLUDED.district, " ..
        "address = EXCLUDED.address, sample = EXCLUDED.sample",
        { m.store_id, m.name, m.brand or "", m.category or "", m.district or "", m.address or "", cards.sample == true })
    end
    for id, d in pairs(cards.stores) do
      q("INSERT INTO marketing_card_data VALUES ($1, $2) ON CONFLICT (store_id) DO UPDATE SET data = EXCLUDED.data",
        { id, mark(d) })
    end
    for district, code in pairs(regions.regions) do
      q("INSERT INTO marketing_regions VALUES ($1, $2) ON CONFLICT (district) DO UPDATE SET " ..
        "admin_dong_code = EXCLUDED.admin_dong_code", { district, code })
    end
    for code, d in pairs(areas.areas) do
      q("INSERT INTO marketing_area_data VALUES ($1, $2) ON CONFLICT (admin_dong_code) DO UPDATE SET data = EXCLUDED.data",
        { code, mark(d) })
    end
    for code, d in pairs(region_data.regions) do
      q("INSERT INTO marketing_region_data VALUES ($1, $2) ON CONFLICT (admin_dong_code) DO UPDATE SET data = EXCLUDED.data",
        { code, mark(d) })
    end
  end)
  if not tok then return nil, tostring(terr) end
  return true
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
        if backend.sample then c.sample = true end
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

---------------------------------------------------------------------------
-- MCP

local function string_arg(name, description)
  return { type = "object", required = { name }, additionalProperties = false,
    properties = { [name] = { type = "string", minLength = 1, description = description } } }
end

-- The tools as `moongraph mcp serve` declares them: name, description, the
-- JSON schema of the input, and a handler over tools.new(backend).
_M.MCP_TOOLS = {
  { name = "search_merchant", arg = "merchant_name",
    description = "Find merchants whose name or brand contains the given name (spaces and punctuation ignored). " ..
      "Returns {found, merchants = [{store_id, name, brand, category, district, address}]}.",
    arg_description = "store name or part of it, e.g. 본죽" },
  { name = "load_store_data", arg = "store_id",
    description = "Card-sales figures of one store (revisit and new-customer shares, delivery share, " ..
      "age and gender mix, peak hours, monthly sales). Returns {success, data} or {success = false, error}.",
    arg_description = "store_id from search_merchant" },
  { name = "resolve_region", arg = "district",
    description = "The administrative-dong code of a district. Returns {success, admin_dong_code} or " ..
      "{success = false, error}.",
    arg_description = "district as search_merchant reports it, e.g. 서울특별시 강남구 역삼1동" },
  { name = "load_area_data", arg = "admin_dong_code",
    description = "Commercial-area figures of an administrative dong (footfall, busiest time, competition). " ..
      "Returns {success, data} or {success = false, error}.",
    arg_description = "code from resolve_region" },
  { name = "load_region_data", arg = "admin_dong_code",
    description = "Regional figures of an administrative dong (residents, spending). " ..
      "Returns {success, data} or {success = false, error}.",
    arg_description = "code from resolve_region" },
}

--[[ mcp() -> the MCP server declaration (moongraph.mcp.server), its
backend from the environment: MARKETING_PG_URL, else MARKETING_DATA_DIR or
data/marketing/. ]]
function _M.mcp()
  local pg_url, dir = os.getenv("MARKETING_PG_URL"), os.getenv("MARKETING_DATA_DIR")
  if pg_url == "" then pg_url = nil end
  if dir == "" then dir = nil end
  local T = _M.new(pg_url and _M.pg_backend(pg_url) or _M.local_backend(dir))
  local tools = {}
  for i, d in ipairs(_M.MCP_TOOLS) do
    local fn, arg = T[d.name], d.arg
    tools[i] = { name = d.name, description = d.description, inputSchema = string_arg(arg, d.arg_description),
      annotations = { readOnlyHint = true, openWorldHint = false },
      handler = function(args) return fn(args[arg]) end }
  end
  return { name = "moongraph-marketing-data", version = "1.0", tools = tools,
    instructions = "Store-marketing data: find a store with search_merchant, then load its card data, " ..
      "resolve its district and load the area and region figures." }
end

return _M
