--[[
moongraph.filecache — data derived from files (a trained model, a search
index), kept in a file between processes and valid only while everything it
was derived from is byte for byte the same.

  local filecache = require "moongraph.filecache"
  local bytes, how = filecache.fetch {
    name = "intent_model",             -- what the entry holds (part of its file name)
    key = data_path,                   -- optional: tells entries of one name apart
    inputs = { data_text, code_text }, -- everything the bytes are derived from
    build = function() return bytes end,   -- or nil, err
  }
  -- how: "hit" | "built" | "built, not saved: <why>" | "built, cache off"

An entry stores copies of its inputs and is used only when each of them
equals the caller's (a content comparison, not a modification time), so
editing a source file, or the code that derives from it, makes the next
fetch build afresh and replace the entry. The caller passes the contents of
the files (and of its own source) it derives from.

Entries live in MOONGRAPH_CACHE_DIR, else $XDG_CACHE_HOME/moongraph, else
$HOME/.cache/moongraph; MOONGRAPH_CACHE_DIR=off keeps none. A directory that
cannot be created or written only costs the build each time. An entry is
written to a temporary file and renamed into place, so a reader sees a whole
entry or none; one that is damaged or from another format is rebuilt.
]]

local io_open, os_getenv, os_rename, os_remove, os_execute = io.open, os.getenv, os.rename, os.remove, os.execute
local type, ipairs, pcall, error, tostring = type, ipairs, pcall, error, tostring
local string_pack, string_unpack, string_format, string_find, byte =
  string.pack, string.unpack, string.format, string.find, string.byte

local _M = {}

local MAGIC = "moongraph-filecache 1\n"

-- The cache directory, or nil and why there is none.
function _M.dir()
  local d = os_getenv("MOONGRAPH_CACHE_DIR")
  if d == "off" then return nil, "cache off" end
  if d and d ~= "" then return (d:gsub("/+$", "")) end
  local xdg = os_getenv("XDG_CACHE_HOME")
  if xdg and xdg ~= "" then return (xdg:gsub("/+$", "")) .. "/moongraph" end
  local home = os_getenv("HOME")
  if home and home ~= "" then return (home:gsub("/+$", "")) .. "/.cache/moongraph" end
  return nil, "no cache directory (set MOONGRAPH_CACHE_DIR or HOME)"
end

-- FNV-1a (32 bits) of a short string, for file names.
local function fnv1a(s)
  local h = 0x811c9dc5
  for i = 1, #s do
    h = ((h ~ byte(s, i)) * 0x01000193) & 0xffffffff
  end
  return h
end

-- The file of an entry: <dir>/<name>-<hash of key>.bin, or nil, why.
-- dir: the cache directory (false: none), else _M.dir().
function _M.path(name, key, dir)
  local why
  if dir == false then return nil, "cache off" end
  if dir == nil then dir, why = _M.dir() end
  if not dir then return nil, why end
  return string_format("%s/%s-%08x.bin", dir, name, fnv1a(key or "")), dir
end

-- The whole file, read in one piece (its size first: one allocation).
local function read_file(path)
  local f = io_open(path, "rb")
  if not f then return nil end
  local size = f:seek("end")
  local s = size and f:seek("set") and f:read(size)
  f:close()
  if size == 0 then return "" end
  return s
end

-- The payload of an entry whose stored inputs equal `inputs`, or nil. The
-- inputs are compared where they lie in the entry (no copies).
local function valid_payload(blob, inputs)
  if not blob or string_find(blob, MAGIC, 1, true) ~= 1 then return nil end
  local ok, payload = pcall(function()
    local n, pos = string_unpack("<I4", blob, #MAGIC + 1)
    if n ~= #inputs then return nil end
    for i = 1, n do
      local input = inputs[i]
      local len
      len, pos = string_unpack("<I4", blob, pos)
      if len ~= #input or (len > 0 and string_find(blob, input, pos, true) ~= pos) then
        return nil
      end
      pos = pos + len
    end
    local p
    p, pos = string_unpack("<s4", blob, pos)
    if pos ~= #blob + 1 then return nil end
    return p
  end)
  return ok and payload or nil
end

local function sh_quote(s)
  return "'" .. s:gsub("'", "'\\''") .. "'"
end

-- Writes an entry; true or nil, why.
local function save(path, dir, inputs, payload)
  local parts = { MAGIC, string_pack("<I4", #inputs) }
  for _, s in ipairs(inputs) do parts[#parts + 1] = string_pack("<s4", s) end
  parts[#parts + 1] = string_pack("<s4", payload)
  local tmp = string_format("%s.%d.%s.tmp", path, os.time(), tostring({}):match("0x(%x+)") or "0")
  -- a writer that dies leaves only its temporary file behind
  local f = io_open(tmp, "wb")
  if not f then
    os_execute("mkdir -p -- " .. sh_quote(dir) .. " 2>/dev/null")
    local err
    f, err = io_open(tmp, "wb")
    if not f then return nil, err end
  end
  local ok, err = f:write(table.concat(parts))
  local cok, cerr = f:close()
  if not ok or not cok then
    os_remove(tmp)
    return nil, err or cerr
  end
  local rok, rerr = os_rename(tmp, path)
  if not rok then
    os_remove(tmp)
    return nil, rerr
  end
  return true
end

--[[ fetch{name, key, inputs, build, dir} -> bytes, how | nil, err
build() -> bytes | nil, err runs when no valid entry exists; its error is
returned as is. dir overrides the cache directory (false: keep nothing). ]]
function _M.fetch(opts)
  if type(opts) ~= "table" then
    error("bad argument #1 to 'fetch': table expected, got " .. type(opts), 2)
  end
  local name, inputs, build = opts.name, opts.inputs, opts.build
  if type(name) ~= "string" or not name:match("^[%w_.-]+$") then
    error("bad argument #1 to 'fetch': name must be letters, digits, '_', '.' or '-'", 2)
  end
  if opts.key ~= nil and type(opts.key) ~= "string" then
    error("bad argument #1 to 'fetch': key must be a string", 2)
  end
  if type(inputs) ~= "table" then
    error("bad argument #1 to 'fetch': inputs must be a list of strings", 2)
  end
  for i, s in ipairs(inputs) do
    if type(s) ~= "string" then
      error("bad argument #1 to 'fetch': input " .. i .. " is a " .. type(s) .. ", not a string", 2)
    end
  end
  if type(build) ~= "function" then
    error("bad argument #1 to 'fetch': build must be a function", 2)
  end
  if opts.dir ~= nil and opts.dir ~= false and type(opts.dir) ~= "string" then
    error("bad argument #1 to 'fetch': dir must be a directory or false", 2)
  end
  local path, dir = _M.path(name, opts.key, opts.dir)
  if path then
    local payload = valid_payload(read_file(path), inputs)
    if payload then return payload, "hit" end
  end
  local bytes, berr = build()
  if type(bytes) ~= "string" then
    if bytes == nil then return nil, berr end
    error("filecache '" .. name .. "': build returned a " .. type(bytes) .. ", not a string", 2)
  end
  if not path then return bytes, "built, " .. dir end
  local ok, werr = save(path, dir, inputs, bytes)
  if not ok then return bytes, "built, not saved: " .. tostring(werr) end
  return bytes, "built"
end

-- The source text of the Lua function `fn`'s chunk (its file, or the code
-- itself when it was loaded from a string): an input for code that derives.
function _M.source_of(fn)
  local info = debug.getinfo(fn, "S")
  local src = info and info.source
  if type(src) ~= "string" then return nil, "no source" end
  if src:sub(1, 1) == "@" then
    local text = read_file(src:sub(2))
    if not text then return nil, "cannot read " .. src:sub(2) end
    return text
  end
  return src
end

return _M
