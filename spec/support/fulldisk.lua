-- fulldisk.lua — a small tmpfs that a spec can fill up, for servers that
-- must lose nothing when the disk is full. The tmpfs is mounted in a mount
-- namespace of its own (unshare -m), held by a sleeping process, so that
-- servers started in it (nsenter) can be killed and started again on the
-- same files; the spec reaches them through /proc/<holder>/root. Where
-- the root is no mount point of its own (a chroot: unshare cannot make
-- the mounts private), the tmpfs is mounted in place and unmounted by
-- destroy(). Needs root either way (make test runs as root).
--
--   local fulldisk = require "fulldisk"
--   local d = fulldisk.new("8m")
--   d.dir                the mount point (an absolute path)
--   d.prefix             { "nsenter", "-t", pid, "-m", "--wd=.", "--" }: run a command in it
--                        (empty when mounted in place)
--   d:path("a/b")        where the spec reads and writes d.dir .. "/a/b"
--   d:fill()  d:free()   take every free byte / give them back
--   d:destroy()
local tmp = require "tmp"
local cli = require "cli"

local _M = {}
local D = {}
D.__index = D

local quote = cli.quote

local function in_namespace(dir, size)
  local cmd = string.format("exec unshare -m --propagation private sh -c %s 2>/dev/null",
    quote(string.format("mount -t tmpfs -o size=%s tmpfs %s && echo $$ && exec sleep 100000", size, quote(dir))))
  local fh = assert(io.popen(cmd, "r"))
  local pid = tonumber(fh:read("l"))
  if not pid then
    fh:close()
    return nil
  end
  local here = io.popen("pwd"):read("l")
  return { dir = dir, pid = pid, fh = fh,
    prefix = { "nsenter", "-t", tostring(pid), "-m", "--wd=" .. here, "--" } }
end

local function in_place(dir, size)
  if not os.execute(string.format("mount -t tmpfs -o size=%s tmpfs %s 2>/dev/null", size, quote(dir))) then
    return nil
  end
  return { dir = dir, mounted = true, prefix = {} }
end

function _M.new(size)
  local dir = tmp.dir("fulldisk", "file")
  local d = in_namespace(dir, size) or in_place(dir, size)
  if not d then error("fulldisk: could not mount a tmpfs (needs root)", 2) end
  return setmetatable(d, D)
end

function D:path(rel)
  local root = self.pid and ("/proc/" .. self.pid .. "/root") or ""
  return root .. self.dir .. (rel and ("/" .. rel) or "")
end

function D:fill()
  os.execute("dd if=/dev/zero of=" .. quote(self:path(".filler")) .. " bs=64k 2>/dev/null")
  -- what dd could not fill with whole blocks
  os.execute("dd if=/dev/zero of=" .. quote(self:path(".filler2")) .. " bs=512 2>/dev/null")
end

function D:free()
  os.remove(self:path(".filler"))
  os.remove(self:path(".filler2"))
end

function D:destroy()
  if self.mounted then
    os.execute("umount -l " .. quote(self.dir) .. " 2>/dev/null")
    self.mounted = nil
  end
  if not self.fh then return end
  os.execute("kill " .. self.pid .. " 2>/dev/null")
  self.fh:close()
  self.fh = nil
end

return _M
