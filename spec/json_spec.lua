-- moongraph.json: the C encoder (runtime/json.c) against the Lua encoder,
-- byte for byte.
local json = require "moongraph.json"
local core = require "moongraph.core"

local c_encode = core.json and core.json.encode

-- A random value: tables nested up to `depth`, strings of any bytes
-- (control characters, quotes, invalid UTF-8, NUL), integers and floats at
-- their edges, booleans, null, empty arrays and objects.
local FLOATS = { 0.0, -0.0, 0.1, 1 / 3, 2.0, 1e15, 1e16, 1e300, -1e-300, 5e-324, 2 ^ 53, 2 ^ 53 + 2,
  2 ^ 63, 123456789.125, 0.1 + 0.2, 1e-7, 100.0, -2.5, 9007199254740993.0, 1.7976931348623157e308 }
local INTS = { 0, 1, -1, 42, math.maxinteger, math.mininteger, 2 ^ 53 // 1, -(2 ^ 31) // 1, 1000000 }

-- rng(a, b): an integer from a to b, the same sequence for the same seed
local function seeded_rng(seed)
  return function(a, b)
    seed = (seed * 1103515245 + 12345) % 2147483648
    return a + seed % (b - a + 1)
  end
end

local function rand_string(rng)
  local n = rng(0, 12)
  local b = {}
  for i = 1, n do
    local kind = rng(1, 6)
    if kind == 1 then b[i] = string.char(rng(0, 31))
    elseif kind == 2 then b[i] = ({ '"', "\\", "\127", "/", "\0" })[rng(1, 5)]
    elseif kind == 3 then b[i] = string.char(rng(128, 255))          -- often invalid UTF-8
    elseif kind == 4 then b[i] = ({ "é", "한", "\u{1F600}", "\u{FFFD}" })[rng(1, 4)]
    else b[i] = string.char(rng(32, 126)) end
  end
  return table.concat(b)
end

local function rand_value(rng, depth)
  local kind = rng(1, depth > 0 and 10 or 7)
  if kind == 1 then return rand_string(rng)
  elseif kind == 2 then return INTS[rng(1, #INTS)] + rng(-2, 2) * (rng(0, 1))
  elseif kind == 3 then
    if rng(0, 1) == 0 then return FLOATS[rng(1, #FLOATS)] end
    return (rng(-1000000, 1000000) / rng(1, 1000)) + 0.0
  elseif kind == 4 then return rng(0, 1) == 1
  elseif kind == 5 then return json.null
  elseif kind == 6 then return rng(0, 1) == 0 and json.array() or {}
  elseif kind == 7 then return "" .. rng(0, 99)
  elseif kind == 8 or kind == 9 then
    local t = {}
    for _ = 1, rng(1, 6) do t[rand_string(rng)] = rand_value(rng, depth - 1) end
    return t
  else
    local t = rng(0, 1) == 0 and json.array() or {}
    for i = 1, rng(1, 6) do t[i] = rand_value(rng, depth - 1) end
    return t
  end
end

local function hex(s)
  return (s:gsub("[^%w%p ]", function(c) return string.format("\\x%02x", c:byte()) end))
end

describe("moongraph.json encoder in C", function()
  it("is built into moongraph.core, and used by json.encode", function()
    assert.is_function(c_encode)
    local t = { a = 1 }
    assert.equal('{"a":1}', c_encode(t, json.null, getmetatable(json.array())))
  end)

  it("writes the Lua encoder's bytes for 5,000 random values, compact and indented", function()
    local rng = seeded_rng(20240615)
    for i = 1, 5000 do
      local v = rand_value(rng, 4)
      for _, opts in ipairs { {}, { indent = true } } do
        local want, werr = json.lua_encode(v, opts)
        local got, gerr = json.encode(v, opts)
        assert(want, "value " .. i .. ": the Lua encoder refused it: " .. tostring(werr))
        if got ~= want then
          error(("value %d%s:\n C   %s\n Lua %s"):format(i, opts.indent and " (indented)" or "", hex(got or tostring(gerr)), hex(want)))
        end
        -- and C itself took it (no silent fall-back to Lua)
        assert.equal(want, c_encode(v, json.null, getmetatable(json.array()), opts.indent or false))
      end
    end
  end)

  it("keeps integers and floats apart and floats exact", function()
    for _, v in ipairs { 2, 2.0, -0.0, 0.1, 1 / 3, 1e300, 5e-324, math.mininteger, math.maxinteger, 2 ^ 63 } do
      local s = json.encode(v)
      assert.equal(json.lua_encode(v), s)
      local back = json.decode(s)
      assert.equal(math.type(v), math.type(back))
      assert.equal(v, back)
    end
    assert.equal("2", json.encode(2))
    assert.equal("2.0", json.encode(2.0))
  end)

  it("sorts keys bytewise, NUL and bytes over 0x7f included", function()
    local t = { ["b"] = 1, ["a\0b"] = 2, ["a"] = 3, ["\xff"] = 4, ["A"] = 5, ["a\0"] = 6 }
    assert.equal(json.lua_encode(t), json.encode(t))
    assert.equal('{"A":5,"a":3,"a\\u0000":6,"a\\u0000b":2,"b":1,"\xff":4}', json.encode(t))
  end)

  it("writes strings byte for byte: invalid UTF-8 kept, control characters escaped", function()
    local s = "\xc3\x28 \x00 \x1f \x7f \" \\ / \b\f\n\r\t é"
    assert.equal(json.lua_encode(s), json.encode(s))
    assert.equal('"\xc3\x28 \\u0000 \\u001f \\u007f \\" \\\\ / \\b\\f\\n\\r\\t é"', json.encode(s))
    assert.equal(s, json.decode(json.encode(s)))
  end)

  it("leaves what it cannot save to the Lua encoder, whose error names the path", function()
    local arr = getmetatable(json.array())
    local cyc = {}
    cyc.me = cyc
    local cases = {
      { { a = { 1, nil, 3 } }, "value.a is a list with holes" },
      { { a = { 1, x = 2 } }, "value.a mixes list items and string keys" },
      { { f = print }, "value.f is a function, which cannot be saved" },
      { { n = 0 / 0 }, "value.n is " .. tostring(0 / 0) .. ", which JSON cannot hold" },
      { { [1.5] = true }, "value has a key of type number (1.5); only string keys or a list 1..n can be saved" },
      { cyc, "value.me is a table that contains itself" },
    }
    for _, c in ipairs(cases) do
      assert.is_nil(c_encode(c[1], json.null, arr))
      local s, err = json.encode(c[1])
      assert.is_nil(s)
      assert.equal(c[2], err)
    end
  end)

  it("hands a table with a metatable of its own to Lua, which encodes it the same way", function()
    local t = setmetatable({ x = 1 }, { __index = function() return 0 end })
    assert.is_nil(c_encode(t, json.null, getmetatable(json.array())))
    assert.equal('{"x":1}', json.encode(t))
  end)

  it("writes very deep nesting through the Lua encoder, unchanged", function()
    local v = "leaf"
    for _ = 1, 300 do v = { v } end
    local s = assert(json.encode(v))
    assert.equal(json.lua_encode(v), s)
  end)
end)

describe("json.copy", function()
  local c_copy = core.json and core.json.copy
  local arr = getmetatable(json.array())

  -- a and b equal down to number subtypes and array markers, and sharing
  -- no table (the null sentinel aside)
  local function same_unshared(a, b, path)
    if type(a) ~= "table" or a == json.null then
      assert(math.type(a) == math.type(b) and (a == b or (a ~= a and b ~= b)),
        path .. ": " .. tostring(a) .. " vs " .. tostring(b))
      return
    end
    assert(type(b) == "table" and a ~= b, path .. ": not a table of its own")
    assert(getmetatable(a) == getmetatable(b), path .. ": metatables differ")
    for k, v in pairs(a) do same_unshared(v, b[k], path .. "." .. tostring(k)) end
    for k in pairs(b) do assert(a[k] ~= nil, path .. ": extra key " .. tostring(k)) end
  end

  it("gives what decode(encode(v)) gives for 5,000 random values, in C, sharing no table", function()
    local rng = seeded_rng(7)
    for i = 1, 5000 do
      local v = rand_value(rng, 4)
      local ok, c = c_copy(v, json.null, arr)
      assert(ok, "value " .. i .. ": C did not copy it")
      local want = json.decode(json.encode(v))
      same_unshared(want, c, "value " .. i)
      if type(v) == "table" and v ~= json.null then assert(c ~= v) end
    end
  end)

  it("decodes in C what the Lua decoder decodes, and refuses what it refuses, with its message", function()
    local rng = seeded_rng(11)
    local alphabet = { "{", "}", "[", "]", ",", ":", '"', "\\", "u", "d", "8", "0", "-", "+", ".",
                       "e", "E", "1", "9", " ", "\n", "t", "n", "\0", "\xe2", "\xff", "a", "/" }
    local function mutate(text)
      local out = text
      for _ = 1, rng(1, 3) do
        local at = rng(1, #out + 1)
        local op = rng(1, 3)
        local piece = alphabet[rng(1, #alphabet)]
        if op == 1 then out = out:sub(1, at - 1) .. piece .. out:sub(at)
        elseif op == 2 then out = out:sub(1, at - 1) .. out:sub(at + 1)
        else out = out:sub(1, at - 1) .. piece .. out:sub(at + 1) end
      end
      return out
    end
    local decoded, refused = 0, 0
    for i = 1, 5000 do
      local text = json.encode(rand_value(rng, 4), { indent = rng(1, 2) == 1 })
      if i % 2 == 0 then text = mutate(text) end
      -- the Lua decoder reads \u escapes with tonumber (it takes " 1a2" and
      -- raises on "-001"); the C one takes exactly four hex digits
      local odd_escape = text:find("\\u[^\\]?[^%x]") or text:find("\\u%x?%x?%x?[^%x]")
      local ok, want, werr = pcall(json.lua_decode, text)
      if ok and not odd_escape then
        local got, gerr = json.decode(text)
        if want == nil then
          assert.is_nil(got, "text " .. i)
          assert.equal(werr, gerr, "text " .. i .. ": " .. text)
          refused = refused + 1
        else
          same_unshared(want, got, "text " .. i)
          decoded = decoded + 1
        end
      end
    end
    assert.is_true(decoded > 2000 and refused > 1000, decoded .. " decoded, " .. refused .. " refused")
    -- numbers as tonumber reads them, and surrogate pairs joined
    local t = json.decode('[1, 1.0, 1e2, -0, 9223372036854775807, 9223372036854775808, "\\ud83d\\ude00\\ud800x"]')
    assert.equal("integer", math.type(t[1])); assert.equal("float", math.type(t[2]))
    assert.equal("float", math.type(t[3])); assert.equal("integer", math.type(t[4]))
    assert.equal(math.maxinteger, t[5]); assert.equal("float", math.type(t[6]))
    assert.equal("\u{1F600}\xed\xa0\x80x", t[7])
    assert.same({ nil, "invalid JSON: bad \\u escape at byte 2" }, { json.decode('"\\u 1a2"') })
  end)

  it("copy(v, prev) reuses prev's tables where v is unchanged, and only there", function()
    local v = { a = { 1, 2.0, "x" }, b = { c = { d = json.array() } }, e = "s", f = { 1 } }
    local prev = json.copy(v)
    v.f[1] = 2                                  -- one part changed
    local c = json.copy(v, prev)
    assert.equal(prev.a, c.a)                   -- unchanged: the same table
    assert.equal(prev.b, c.b)
    assert.are_not.equal(prev.f, c.f)           -- changed: a new one
    assert.same({ 2 }, c.f)
    assert.are_not.equal(prev, c)
    -- integer and float, and the empty-array marker, count as changes
    local p2 = json.copy { n = { 1 }, m = {} }
    local c2 = json.copy({ n = { 1.0 }, m = json.array() }, p2)
    assert.are_not.equal(p2.n, c2.n); assert.equal("float", math.type(c2.n[1]))
    assert.are_not.equal(p2.m, c2.m); assert.equal(arr, getmetatable(c2.m))
    -- and so does the sign of a zero (equal, but written "-0.0")
    local p3 = json.copy { z = { 0.0 } }
    local c3 = json.copy({ z = { -0.0 } }, p3)
    assert.are_not.equal(p3.z, c3.z); assert.equal("[-0.0]", json.encode(c3.z))
    -- random values and random changes: always what copy(v) alone gives
    local rng = seeded_rng(5)
    for i = 1, 2000 do
      local a = rand_value(rng, 4)
      local b = rng(1, 3) == 1 and rand_value(rng, 4) or json.decode(json.encode(a))
      local pa = json.copy(a)
      local cb = json.copy(b, pa)
      assert.same(json.copy(b), cb, "value " .. i)
      local want = json.decode(json.encode(b))
      -- same types down to integers and floats
      local function types(x, y, path)
        if type(x) ~= "table" or x == json.null then
          assert(math.type(x) == math.type(y) and type(x) == type(y), path)
          return
        end
        assert(getmetatable(x) == getmetatable(y), path .. ": markers differ")
        for k, xv in pairs(x) do types(xv, y[k], path .. "." .. tostring(k)) end
      end
      types(want, cb, "value " .. i)
    end
  end)

  it("keeps the array marker of empty lists only, as decode does", function()
    local c = json.copy { a = json.array(), b = json.array { 1 }, c = {} }
    assert.equal(arr, getmetatable(c.a))
    assert.is_nil(getmetatable(c.b))
    assert.is_nil(getmetatable(c.c))
  end)

  it("leaves what C cannot take to the codec: the same refusals, the same copies", function()
    local cyc = {}
    cyc.me = cyc
    for _, v in ipairs { { a = { 1, nil, 3 } }, { f = print }, { n = 0 / 0 }, { [1.5] = true }, cyc } do
      assert.is_false(c_copy(v, json.null, arr))
      local c, err = json.copy(v)
      assert.is_nil(c)
      assert.equal(select(2, json.encode(v)), err)
    end
    local odd = setmetatable({ x = 1 }, { __index = function() return 0 end })
    assert.is_false(c_copy(odd, json.null, arr))
    local c = json.copy(odd)
    assert.same({ x = 1 }, c)
    assert.is_nil(getmetatable(c))
  end)
end)

describe("json.copy_state", function()
  -- moongraph.json loaded again without the core module: its Lua copy_state
  local function lua_json()
    local env = setmetatable({}, { __index = _G })
    env.require = function(name)
      if name == "moongraph.core" then error("no core here") end
      return require(name)
    end
    local chunk = assert(loadfile("runtime/lua/moongraph/json.lua", "t", env))
    return chunk()
  end

  for _, impl in ipairs { "C", "Lua" } do
    local J = impl == "C" and json or lua_json()

    it("(" .. impl .. ") walks only the keys written or replaced since the last copy", function()
      local rng = seeded_rng(impl == "C" and 17 or 19)
      for i = 1, 300 do
        local state = {}
        for k = 1, rng(1, 8) do state["k" .. k] = rand_value(rng, 3) end
        local src, written = {}, {}
        local c = assert(J.copy_state(state, nil, src, written))
        assert.same(J.copy(state), c, "state " .. i)
        for k, v in pairs(state) do assert.equal(v, src[k]) end
        -- a step: keys replaced, keys written after a change in place, keys
        -- changed in place and never written, keys untouched
        local what = {}
        for k, v in pairs(state) do
          local r = rng(1, 4)
          what[k] = r
          if r == 1 then
            state[k] = rand_value(rng, 3)
          elseif (r == 2 or r == 3) and type(v) == "table" and v ~= J.null then
            v["added"] = "in place"
            if getmetatable(v) then setmetatable(v, nil) end
            v[1] = nil
            for j = #v, 1, -1 do v[j] = nil end
            if r == 2 then written[k] = true end
          end
        end
        local old = c
        c = assert(J.copy_state(state, old, src, written))
        assert.are_not.equal(old, c)
        assert.is_nil(next(written), "written is emptied")
        for k, v in pairs(state) do
          assert.equal(v, src[k])
          if what[k] == 3 or what[k] == 4 then
            -- not written, the same value: the last copy's part itself
            assert.equal(old[k], c[k], "state " .. i .. " key " .. k)
          else
            assert.same(J.copy(v), c[k], "state " .. i .. " key " .. k)
          end
        end
      end
    end)

    it("(" .. impl .. ") takes a key prev lacks, leaves out a key gone, and refuses what copy refuses", function()
      local src = {}
      local c = assert(J.copy_state({ a = { 1 } }, nil, src))
      local t = { 2 }
      local c2 = assert(J.copy_state({ a = src.a, b = t }, c, src))
      assert.equal(c.a, c2.a)
      assert.same({ 2 }, c2.b)
      assert.are_not.equal(t, c2.b)
      local c3 = assert(J.copy_state({ b = t }, c2, src))
      assert.is_nil(c3.a)
      assert.equal(c2.b, c3.b)
      assert.is_nil(J.copy_state({ f = print }, nil, {}))
      assert.is_nil(J.copy_state({ [1] = "x" }, nil, {}))
    end)
  end
end)

describe("json.pack", function()
  local arr = getmetatable(json.array())

  local function same(a, b, path)
    if type(a) ~= "table" or a == json.null then
      assert(math.type(a) == math.type(b) and a == b, path .. ": " .. tostring(a) .. " vs " .. tostring(b))
      return
    end
    assert(type(b) == "table" and getmetatable(a) == getmetatable(b), path .. ": tables differ")
    for k, v in pairs(a) do same(v, b[k], path .. "." .. tostring(k)) end
    for k in pairs(b) do assert(a[k] ~= nil, path .. ": extra key " .. tostring(k)) end
  end

  it("packs 5,000 random values into one string each, which unpack turns into what copy gives", function()
    local rng = seeded_rng(11)
    for i = 1, 5000 do
      local v = rand_value(rng, 4)
      local p = core.pack.pack(json.null, arr, v)
      assert.is_string(p, "value " .. i .. ": C did not pack it")
      local back = json.unpack(p)
      same(json.copy(v), back, "value " .. i)
      if type(v) == "table" and v ~= json.null then
        assert(back ~= v and json.unpack(p) ~= back, "value " .. i .. ": tables shared")
      end
    end
    assert.equal("integer", math.type(json.unpack(json.pack(2))))
    assert.equal("float", math.type(json.unpack(json.pack(2.0))))
    assert.equal(1 / -0.0, 1 / json.unpack(json.pack(-0.0)))
    local a, b, c = json.unpack(json.pack({ 1 }, "two", json.array()))
    assert.same({ 1 }, a)
    assert.equal("two", b)
    assert.equal(arr, getmetatable(c))
  end)

  it("refuses what cannot be saved, naming it, and takes through the codec what C leaves", function()
    local p, err = json.pack { f = print }
    assert.is_nil(p)
    assert.equal("value.f is a function, which cannot be saved", err)
    local arr = getmetatable(json.array())
    local holes = { 1, 2, 3 }
    holes[2] = nil
    for _, v in ipairs { { a = holes }, { a = { 1, x = 2 } }, { [1.5] = true }, { [3] = "x" }, { 1, [0] = 0 } } do
      assert.is_nil(core.pack.pack(json.null, arr, v))
      assert.equal(select(2, json.encode(v)), select(2, json.pack(v)))
    end
    local odd = setmetatable({ x = 1 }, { __index = function() return 0 end })
    local back = json.unpack(assert(json.pack(odd)))
    assert.same({ x = 1 }, back)
    assert.is_nil(getmetatable(back))
  end)

  it("rejects bytes that are not a packed value", function()
    for _, s in ipairs { "", "s\255\255\255\127x", "lxyz", "q", "i12" } do
      assert.has_error(function() json.unpack(s) end, "unpack: not a packed value")
    end
  end)
end)
