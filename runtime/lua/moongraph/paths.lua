--[[
moongraph.paths — files that travel with Lua modules (prompts/, data/).

An application's files live beside its modules: the directory that holds
scripts/ and nodes/ also holds prompts/ and data/. So a file is looked up the
way `require` looks up a module, in the roots of package.path (MOONGRAPH_PATH,
the working directory, the moongraph binary's own directory, installed
trees), first match wins:

  paths.find("prompts/answer.txt") -> "/srv/app/prompts/answer.txt" | nil, err
  paths.find("data/marketing")     -> a directory works the same way
  paths.roots()                    -> { "./", "/srv/app/", ... }

And the one way a string becomes a file name (the file saver's thread
directories, the service's records):

  paths.component(s)        -> s with every byte but letters, digits, _ and - as %XX
  paths.decode_component(c) -> the string back
]]

local io_open, package, type, ipairs, error, tonumber = io.open, package, type, ipairs, error, tonumber
local string_find, table_concat = string.find, table.concat
local string_format, string_byte, string_char, string_gsub = string.format, string.byte, string.char, string.gsub

local _M = {}

local function enc_char(c) return string_format("%%%02X", string_byte(c)) end
function _M.component(s) return (string_gsub(s, "[^%w_%-]", enc_char)) end

local function dec_char(h) return string_char(tonumber(h, 16)) end
function _M.decode_component(s) return (string_gsub(s, "%%(%x%x)", dec_char)) end

-- The directory part of each package.path template ("X/?.lua" -> "X/").
function _M.roots()
  local out, seen = {}, {}
  for template in package.path:gmatch("[^;]+") do
    local q = string_find(template, "?", 1, true)
    if q then
      local dir = template:sub(1, q - 1)
      if dir == "" then dir = "./" end
      if dir:sub(-1) == "/" and not seen[dir] then
        seen[dir] = true
        out[#out + 1] = dir
      end
    end
  end
  return out
end

local found = {}

-- find(rel) -> path | nil, err: the first root holding the file rel.
function _M.find(rel)
  if type(rel) ~= "string" or rel == "" then
    error("bad argument #1 to 'find': relative path expected, got " .. type(rel), 2)
  end
  local hit = found[rel]
  if hit then return hit end
  local roots = _M.roots()
  for _, root in ipairs(roots) do
    local path = root .. rel
    local f = io_open(path, "rb")
    if f then
      f:close()
      found[rel] = path
      return path
    end
  end
  return nil, "'" .. rel .. "' not found beside the modules on package.path (looked in " ..
    table_concat(roots, ", ") .. ")"
end

-- read(rel) -> contents | nil, err
function _M.read(rel)
  local path, err = _M.find(rel)
  if not path then return nil, err end
  local f, oerr = io_open(path, "rb")
  if not f then return nil, oerr end
  local text = f:read("a")
  f:close()
  return text
end

return _M
