-- The Eco² intent model is trained once and kept in a cache file between
-- processes (moongraph.filecache). A script author who edits
-- data/intents.jsonl or a keyword table gets the edit on the very next run:
-- never a stale model. Runs `moongraph route` as a user would, in a
-- directory holding copies of data/ and scripts/eco/keyword_map.lua (found
-- before the repository's own: the working directory comes first).
local cli = require "cli"
local tmp = require "tmp"

local ROOT = os.getenv("PWD")
local BIN = cli.bin:sub(1, 1) == "/" and cli.bin or (ROOT .. "/" .. cli.bin:gsub("^%./", ""))
local q = cli.quote

local function slurp(path)
  local f = assert(io.open(path, "rb"))
  local s = f:read("a")
  f:close()
  return s
end

local function spit(path, s)
  local f = assert(io.open(path, "wb"))
  f:write(s)
  f:close()
end

-- `moongraph route MESSAGE` in dir with its own cache -> intent, the whole output
local function route(dir, cache, message)
  local out = dir .. "/route.out"
  local cmd = "cd " .. q(dir) .. " && MOONGRAPH_CACHE_DIR=" .. q(cache) .. " " .. q(BIN) ..
    " route " .. q(message) .. " >" .. q(out) .. " 2>&1"
  local ok = os.execute(cmd)
  local text = slurp(out)
  assert(ok, "moongraph route failed:\n" .. text)
  local intent = text:match("\nintent: (%S+)")
  assert(intent, "no intent line in:\n" .. text)
  return intent, text
end

local function cache_entries(cache)
  local p = assert(io.popen("ls " .. q(cache)))
  local names = {}
  for n in p:lines() do names[#names + 1] = n end
  p:close()
  return names
end

describe("the Eco² intent model kept between processes", function()
  local dir, cache
  local MESSAGE = "쿼카쿼카 뿌잉뿌잉"

  before_each(function()
    dir, cache = tmp.dir("model"), tmp.dir("model-cache")
    assert(os.execute("cp -r " .. q(ROOT .. "/data") .. " " .. q(dir .. "/data")))
    assert(os.execute("mkdir -p " .. q(dir .. "/scripts/eco")))
    assert(os.execute("cp " .. q(ROOT .. "/scripts/eco/keyword_map.lua") .. " " .. q(dir .. "/scripts/eco/")))
  end)

  it("is trained on the first run, then loaded from the cache with the same answer", function()
    local first, text1 = route(dir, cache, "냉장고 버리려면 어떻게 해?")
    local entries = cache_entries(cache)
    assert.equal("bulk_waste", first)
    assert.is_true(#entries >= 1, "no cache entry after the first run")
    local entry = cache .. "/" .. entries[1]
    local bytes = slurp(entry)
    local second, text2 = route(dir, cache, "냉장고 버리려면 어떻게 해?")
    assert.equal(first, second)
    assert.equal(text1, text2)
    assert.equal(bytes, slurp(entry))
  end)

  it("is retrained on the next run after data/intents.jsonl changes", function()
    local before = route(dir, cache, MESSAGE)
    assert.are_not.equal("character", before)
    local lines = {}
    for _, m in ipairs { "쿼카쿼카 모으고 싶어", "쿼카쿼카 뿌잉뿌잉 어디서 얻어", "뿌잉뿌잉 쿼카쿼카 컬렉션",
                         "쿼카쿼카 캐릭터", "뿌잉뿌잉 캐릭터 얻는 법", "쿼카쿼카 뿌잉뿌잉 보여줘 캐릭터" } do
      lines[#lines + 1] = '{"message": "' .. m .. '", "intent": "character", "additional_intents": []}'
    end
    local path = dir .. "/data/intents.jsonl"
    spit(path, slurp(path) .. table.concat(lines, "\n") .. "\n")
    local after = route(dir, cache, MESSAGE)
    assert.equal("character", after)
  end)

  it("applies an edited keyword table on the next run", function()
    local _, text = route(dir, cache, MESSAGE)
    local intent = text:match("\nintent: (%S+)")
    assert.matches("keyword adjustment: %-0%.10", text)
    local path = dir .. "/scripts/eco/keyword_map.lua"
    local src = slurp(path)
    local edited, n = src:gsub("\n  " .. intent .. " = {", "\n  " .. intent .. ' = { "쿼카쿼카",', 1)
    assert.equal(1, n, "no table for " .. intent .. " in keyword_map.lua")
    spit(path, edited)
    local again, text2 = route(dir, cache, MESSAGE)
    assert.equal(intent, again)
    assert.matches("keyword adjustment: %+0%.10", text2)
  end)
end)
