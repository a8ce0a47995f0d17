-- Locating and loading the JSON assets under data/. The directory is
-- MOONGRAPH_DATA_DIR when set, otherwise the data/ directory beside nodes/
-- (found from this file's own path), so nodes work from any working
-- directory. Decoded files are cached per path.
local cjson = require "cjson.safe"
local io, os = io, os

local _M = {}

local cache = {}

local function here()
  local src = debug.getinfo(1, "S").source
  if src:sub(1, 1) ~= "@" then return nil end
  local path = src:sub(2)
  return path:match("^(.*)/nodes/lib/data%.lua$") or
         (path == "nodes/lib/data.lua" and ".") or nil
end

-- The repository root (the directory holding nodes/, data/ and prompts/).
function _M.root()
  return here() or "."
end

function _M.dir()
  local env = os.getenv("MOONGRAPH_DATA_DIR")
  if env and env ~= "" then return (env:gsub("/$", "")) end
  return _M.root() .. "/data"
end

-- Reads and decodes data/<rel>. Returns the decoded table or nil, err.
function _M.load(rel)
  if type(rel) ~= "string" then
    error("bad argument #1 to 'load': string expected, got " .. type(rel), 2)
  end
  local path = _M.dir() .. "/" .. rel
  if cache[path] then return cache[path] end
  local f, err = io.open(path, "rb")
  if not f then return nil, "cannot open data file: " .. err end
  local text = f:read("a")
  f:close()
  local value, derr = cjson.decode(text)
  if type(value) ~= "table" then
    return nil, ("malformed JSON in %s: %s"):format(path, derr or "not an object")
  end
  cache[path] = value
  return value
end

-- Like load, but raises (for nodes, whose errors the graph policy handles).
function _M.require(rel)
  local v, err = _M.load(rel)
  if not v then error(err, 0) end
  return v
end

-- Reads a text asset (prompts/ etc.) relative to the repository root.
function _M.read_text(rel)
  local f, err = io.open(_M.root() .. "/" .. rel, "rb")
  if not f then return nil, err end
  local s = f:read("a")
  f:close()
  return s
end

function _M.clear_cache()
  cache = {}
end

return _M
