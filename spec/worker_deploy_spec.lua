-- The worker container and its Kubernetes example, checked without a
-- Docker engine: every path the Dockerfile copies exists, its package
-- lists match tools/debian-packages.txt (what `make deps` installs), and
-- the runtime stage has the package of every library the binary links.
local function read(path)
  local f = assert(io.open(path, "r"), path .. " is missing")
  local s = f:read("a")
  f:close()
  return s
end

local function set(list)
  local s = {}
  for _, v in ipairs(list) do s[v] = true end
  return s
end

local function sorted(t)
  local l = {}
  for k in pairs(t) do l[#l + 1] = k end
  table.sort(l)
  return l
end

local function sh(cmd)
  local p = assert(io.popen(cmd))
  local out = p:read("a")
  p:close()
  return out
end

-- The Dockerfile's stages: { {from=, lines = {...}, installs = {...}, copies = {...}} }
local function stages(text)
  local out, cur = {}, nil
  -- join continuation lines
  text = text:gsub("\\\n", " ")
  for line in text:gmatch("[^\n]+") do
    local from = line:match("^FROM%s+(%S+)")
    if from then
      cur = { from = from, installs = {}, copies = {} }
      out[#out + 1] = cur
    elseif cur then
      local inst = line:match("^RUN .-apt%-get install%s+(.-)%s*&&") or line:match("^RUN .-apt%-get install%s+(.-)%s*$")
      if inst then
        for w in inst:gmatch("%S+") do
          if not w:match("^%-") then cur.installs[#cur.installs + 1] = w end
        end
      end
      local args = line:match("^COPY%s+(.*)$")
      if args and not args:match("^%-%-from") then
        local parts = {}
        for w in args:gmatch("%S+") do parts[#parts + 1] = w end
        for i = 1, #parts - 1 do cur.copies[#cur.copies + 1] = parts[i] end
      end
    end
  end
  return out
end

local function package_list()
  local l = {}
  for line in read("tools/debian-packages.txt"):gmatch("[^\n]+") do
    if not line:match("^%s*#") and line:match("%S") then l[#l + 1] = line:match("^%s*(%S+)") end
  end
  return l
end

describe("the worker container", function()
  local text = read("Dockerfile")
  local st = stages(text)

  it("is a Debian 12 slim multi-stage build", function()
    assert.equal(2, #st)
    assert.equal("debian:12-slim", st[1].from)
    assert.equal("debian:12-slim", st[2].from)
    assert.matches("COPY %-%-from=build /src/moongraph", text)
    assert.matches("RUN make\n", text, 1, true)
  end)

  it("copies only paths that exist", function()
    local n = 0
    for _, s in ipairs(st) do
      for _, p in ipairs(s.copies) do
        local ok = os.execute("test -e '" .. p .. "'")
        assert.is_true(ok == true, "the Dockerfile copies " .. p .. ", which does not exist")
        n = n + 1
      end
    end
    assert.is_true(n >= 7)
  end)

  it("builds with the packages of tools/debian-packages.txt, less the documented test-only ones", function()
    local test_only = text:match("test%-only %(not installed here%):%s*([^\n]+)")
    assert.is_string(test_only, "the Dockerfile must name its test-only packages")
    local want = set(package_list())
    for w in test_only:gmatch("%S+") do
      assert.is_true(want[w] ~= nil, w .. " is called test-only but is not in tools/debian-packages.txt")
      want[w] = nil
    end
    assert.same(sorted(want), sorted(set(st[1].installs)))
  end)

  it("runs with the library package of each build package it needs, as documented", function()
    local listed = set(package_list())
    local mapping = {}
    for rt, from in text:gmatch("\n#%s+(%S+)%s+<%-%s+(%S+)[ \t]*") do mapping[rt] = from end
    local installs = set(st[2].installs)
    assert.is_true(#sorted(mapping) >= 5, "the Dockerfile documents no '# runtime-package <- build-package' lines")
    assert.same(sorted(installs), sorted(mapping))
    for rt, from in pairs(mapping) do
      assert.is_true(listed[from] ~= nil, rt .. " comes from " .. from .. ", which tools/debian-packages.txt lacks")
    end
  end)

  it("has in its runtime stage the package of every library the binary links or opens", function()
    local needed = {}
    for lib in sh("readelf -d ./moongraph"):gmatch("NEEDED%)%s+Shared library: %[([^%]]+)%]") do
      needed[#needed + 1] = lib
    end
    assert.is_true(#needed >= 6)
    -- the libraries opened on first use (runtime/lazylib.h)
    local opened = 0
    for soname in sh("cat runtime/*_api.c"):gmatch('#define%s+[%w_]+_SONAME%s+"([^"]+)"') do
      needed[#needed + 1] = soname
      opened = opened + 1
    end
    assert.is_true(opened >= 2, "no *_SONAME in runtime/*_api.c")
    local ldd = sh("ldd ./moongraph") .. sh("ldconfig -p")
    local installs = set(st[2].installs)
    for _, lib in ipairs(needed) do
      local path = ldd:match("%s" .. lib:gsub("%p", "%%%0") .. " => (%S+)")
                or ldd:match("%s" .. lib:gsub("%p", "%%%0") .. " %([^)]*%) => (%S+)")
      assert.is_string(path, lib .. " not resolved by ldd or ldconfig")
      local pkg = sh("dpkg -S " .. path .. " 2>/dev/null"):match("^([^:,]+)")
      if not pkg then
        pkg = sh("dpkg -S $(readlink -f " .. path .. ") 2>/dev/null"):match("^([^:,]+)")
      end
      if not pkg and path:match("^/lib/") then
        pkg = sh("dpkg -S /usr" .. path .. " 2>/dev/null"):match("^([^:,]+)")
      end
      assert.is_string(pkg, "no package owns " .. path)
      if pkg ~= "libc6" then   -- in the base image
        assert.is_true(installs[pkg] ~= nil, lib .. " comes from " .. pkg .. ", which the runtime stage does not install")
      end
    end
  end)
end)

-- The scripts a Dockerfile ENV line or a Kubernetes env entry names
-- (MOONGRAPH_WORKER_SCRIPT, NAME=PATH, comma-separated): their paths.
local function script_paths(value)
  local out = {}
  for spec in value:gmatch("[^,%s]+") do out[#out + 1] = spec:match("^[%w_%-%.]+=(.+)$") or spec end
  return out
end

describe("the worker's script", function()
  it("is named by the image, and exists in it", function()
    local value = read("Dockerfile"):match("\nENV MOONGRAPH_WORKER_SCRIPT=(%S+)")
    assert.is_string(value, "the Dockerfile must set MOONGRAPH_WORKER_SCRIPT (the worker has no default)")
    local paths = script_paths(value)
    assert.is_true(#paths > 0)
    for _, p in ipairs(paths) do
      assert.is_true(os.execute("test -f '" .. p .. "'") == true, p .. " does not exist")
      assert.matches("^scripts/", p)      -- copied into /app by COPY scripts/
    end
  end)

  it("is named by the Kubernetes example", function()
    local value = read("deploy/worker.yaml"):match("name: MOONGRAPH_WORKER_SCRIPT%s+value: (%S+)")
    assert.is_string(value)
    for _, p in ipairs(script_paths(value)) do
      assert.is_true(os.execute("test -f '" .. p .. "'") == true, p .. " does not exist")
    end
  end)
end)

describe("the Kubernetes example", function()
  local y = read("deploy/worker.yaml")

  it("has a Deployment of the worker and an HPA that scales it", function()
    assert.matches("kind: Deployment", y, 1, true)
    assert.matches("kind: HorizontalPodAutoscaler", y, 1, true)
    local dep = y:match("kind: Deployment%s+metadata:%s+name: (%S+)")
    local target = y:match("scaleTargetRef:%s+apiVersion: apps/v1%s+kind: Deployment%s+name: (%S+)")
    assert.is_string(dep)
    assert.equal(dep, target)
    assert.matches('"worker"', y, 1, true)
  end)

  it("gives the drain more time than the worker's grace period", function()
    local term = tonumber(y:match("terminationGracePeriodSeconds: (%d+)"))
    local grace = tonumber(y:match('"%-%-grace", "(%d+)"'))
    assert.is_number(term)
    assert.is_number(grace)
    assert.is_true(term > grace)
  end)
end)
