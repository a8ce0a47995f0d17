--[[
moongraph.chunkcache — Lua files compiled once, not at every start.

Compiling the scripts of an application (its graph, nodes and libraries) is
most of the CPU of a short command such as `moongraph chat`. `require` of a
Lua file found on package.path goes through `searcher` below, which keeps
the compiled chunk (with its debug information) in the file cache: an entry
is used only while the file's text is byte for byte the one it was compiled
from, so an edited script is compiled afresh on its next load. With the
cache off or unwritable, files are compiled as plain `require` does.

  local chunkcache = require "moongraph.chunkcache"
  local fn, err = chunkcache.loadfile(path)   -- as loadfile(path)
]]

local filecache = require "moongraph.filecache"

local io_open, load, loadfile, string_dump, string_format, string_byte =
  io.open, load, loadfile, string.dump, string.format, string.byte
local package = package

local _M = {}

-- Part of every entry's inputs: bytecode is only good for the Lua it came from.
local FORMAT = "chunkcache 1 " .. _VERSION

-- The text a Lua file compiles from, as luaL_loadfile reads it: a UTF-8 byte
-- order mark dropped and a first line starting with '#' blanked (its newline
-- kept, so line numbers stay right). nil for a precompiled file.
local function source_text(raw)
  if raw:sub(1, 3) == "\239\187\191" then raw = raw:sub(4) end
  if string_byte(raw, 1) == 27 then return nil end
  if string_byte(raw, 1) == 35 then
    local nl = raw:find("\n", 1, true)
    return nl and raw:sub(nl) or ""
  end
  return raw
end

-- loadfile(path) with the compiled chunk kept between processes. Errors
-- (a missing file, a syntax error) are loadfile's own.
function _M.loadfile(path)
  local f = io_open(path, "rb")
  if not f then return loadfile(path) end
  local raw = f:read("a")
  f:close()
  local text = raw and source_text(raw)
  if not text then return loadfile(path) end
  local chunkname = "@" .. path
  local bytes = filecache.fetch {
    name = "luac",
    key = path,
    inputs = { FORMAT, text },
    build = function()
      local fn, err = load(text, chunkname, "t")
      if not fn then return nil, err end
      return string_dump(fn, false)
    end,
  }
  if not bytes then return loadfile(path) end
  local fn = load(bytes, chunkname, "b")
  if not fn then return loadfile(path) end
  return fn
end

-- A package.searchers entry for Lua files on package.path, as Lua's own.
function _M.searcher(name)
  local path, tried = package.searchpath(name, package.path)
  if not path then return tried end
  local fn, err = _M.loadfile(path)
  if not fn then
    error(string_format("error loading module '%s' from file '%s':\n\t%s", name, path, err), 2)
  end
  return fn, path
end

return _M
