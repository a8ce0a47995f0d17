-- Locating and loading the JSON assets under data/. The directory is
-- MOONGRAPH_DATA_DIR when set, otherwise the data/ directory beside the
-- modules (moongraph.paths), so nodes work from any working directory.
-- Decoded files are cached per path, with the text they were decoded from.
local cjson = require "cjson.safe"
local paths = require "moongraph.paths"
local io, os = io, os

local _M = {}

local cache = {}

-- The file data/<rel>: under MOONGRAPH_DATA_DIR when set, else beside the
-- modules. -> path | nil, err
function _M.path(rel)
  local env = os.getenv("MOONGRAPH_DATA_DIR")
  if env and env ~= "" then return (env:gsub("/$", "")) .. "/" .. rel end
  return paths.find("data/" .. rel)
end

-- Reads and decodes data/<rel>. Returns the decoded table (and the text it
-- was decoded from) or nil, err.
function _M.load(rel)
  if type(rel) ~= "string" then
    error("bad argument #1 to 'load': string expected, got " .. type(rel), 2)
  end
  local path, perr = _M.path(rel)
  if not path then return nil, "cannot open data file: " .. perr end
  local hit = cache[path]
  if hit then return hit.value, hit.text end
  local f, err = io.open(path, "rb")
  if not f then return nil, "cannot open data file: " .. err end
  local text = f:read("a")
  f:close()
  local value, derr = cjson.decode(text)
  if type(value) ~= "table" then
    return nil, ("malformed JSON in %s: %s"):format(path, derr or "not an object")
  end
  cache[path] = { value = value, text = text }
  return value, text
end

-- Like load, but raises (for nodes, whose errors the graph policy handles).
function _M.require(rel)
  local v, text = _M.load(rel)
  if not v then error(text, 0) end
  return v, text
end

function _M.clear_cache()
  cache = {}
end

return _M
