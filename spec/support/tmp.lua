-- tmp.lua — temporary directories and files for specs, removed after use.
--
--   local tmp = require "tmp"
--   tmp.dir([tag [, "file"]])  a new empty directory, $TMPDIR/moongraph-spec-TAG.XXXXXX
--   tmp.path([name [, tag]])   a path that does not exist yet, in a new directory
--   tmp.file(contents [, name [, tag]])  a new file holding contents; its path
--   tmp.remove(path)           remove a directory made here (or the one made
--                              for a path or file) now; false if already gone
--
-- Under busted, what is made while a test runs is removed when that test
-- ends, passed or failed; what is made outside a test (setup, before_each,
-- a describe body) is removed when the spec file ends. tmp.dir(tag, "file")
-- keeps a directory made in a test until the file ends (for one a process
-- started in the test still uses until teardown stops it). Outside busted
-- (benchmarks) nothing is removed by itself: call tmp.remove.
--
-- Making a directory raises with the reason when it fails; nothing here
-- returns a path that was not made.

local io, os, table = io, os, table
local assert, error, pcall, require, type, tostring, pairs =
      assert, error, pcall, require, type, tostring, pairs

local _M = {}

local function q(s)
  return "'" .. tostring(s):gsub("'", "'\\''") .. "'"
end

-- One state for the whole run: busted unloads the modules a spec file
-- required when the file ends, so the state and the hooks live in the
-- registry, made once.
local KEY = "moongraph.spec.tmp"
local registry = debug.getregistry()
local S = registry[KEY]

local function rm(dir)
  -- only what mktemp made here: a path of our own pattern
  if type(dir) ~= "string" or not dir:match("/moongraph%-spec%-[%w_-]+%.[%w]+$") then
    error("tmp: refusing to remove " .. tostring(dir), 3)
  end
  os.execute("rm -rf -- " .. q(dir))
end

local function sweep(list)
  if #list == 0 then return end
  local gone = {}
  for i = #list, 1, -1 do
    gone[list[i]] = true
    rm(list[i])
    list[i] = nil
  end
  for p, d in pairs(S.owner) do
    if gone[d] then S.owner[p] = nil end
  end
end

if not S then
  S = { test = {}, file = {}, owner = {}, in_test = false, hooked = false }
  registry[KEY] = S
  local ok, busted = pcall(require, "busted")
  if ok and type(busted) == "table" and type(busted.subscribe) == "function" then
    -- handlers return (nil, true): the other subscribers still run
    busted.subscribe({ "test", "start" }, function()
      S.in_test = true
      return nil, true
    end)
    busted.subscribe({ "test", "end" }, function()
      S.in_test = false
      sweep(S.test)
      return nil, true
    end)
    busted.subscribe({ "file", "end" }, function()
      sweep(S.test)
      sweep(S.file)
      return nil, true
    end)
    busted.subscribe({ "exit" }, function()
      sweep(S.test)
      sweep(S.file)
      return nil, true
    end)
    S.hooked = true
  end
end

-- true when made directories are removed by themselves (running under busted)
_M.automatic = S.hooked

function _M.dir(tag, scope)
  tag = tag or "spec"
  if type(tag) ~= "string" or not tag:match("^[%w_-]+$") then
    error("bad argument #1 to 'dir': tag of letters, digits, - or _ expected", 2)
  end
  if scope ~= nil and scope ~= "file" then
    error("bad argument #2 to 'dir': nil or \"file\" expected", 2)
  end
  local base = os.getenv("TMPDIR")
  if not base or base == "" then base = "/tmp" end
  local p = io.popen("mktemp -d " .. q(base .. "/moongraph-spec-" .. tag .. ".XXXXXX") .. " 2>&1")
  local out = p and p:read("a") or ""
  local ok = p and p:close()
  local dir = out:match("^([^\n]+)\n?$")
  if not ok or not dir or not dir:match("/moongraph%-spec%-") then
    error("tmp: mktemp -d failed: " .. out, 2)
  end
  local list = (S.in_test and scope ~= "file") and S.test or S.file
  list[#list + 1] = dir
  S.owner[dir] = dir
  return dir
end

function _M.path(name, tag)
  local dir = _M.dir(tag)
  local path = dir .. "/" .. (name or "file")
  S.owner[path] = dir
  return path
end

function _M.file(contents, name, tag)
  local path = _M.path(name, tag)
  local f = assert(io.open(path, "wb"))
  assert(f:write(contents))
  assert(f:close())
  return path
end

-- -> true, or false when path is not (or no longer) one made here
function _M.remove(path)
  local dir = S.owner[path]
  if not dir then return false end
  for _, list in pairs { S.test, S.file } do
    for i = #list, 1, -1 do
      if list[i] == dir then table.remove(list, i) end
    end
  end
  for p, d in pairs(S.owner) do
    if d == dir then S.owner[p] = nil end
  end
  rm(dir)
  return true
end

return _M
