local reducers = require "moongraph.reducers"
local json = require "moongraph.json"

describe("reducers", function()
  it("last replaces", function()
    assert.equal(2, reducers.last(1, 2))
  end)

  it("append concatenates lists and appends single items without touching the old list", function()
    local old = { 1, 2 }
    assert.same({ 1, 2, 3, 4 }, reducers.append(old, { 3, 4 }))
    assert.same({ 1, 2, { k = "v" } }, reducers.append(old, { k = "v" }))
    assert.same({ "x" }, reducers.append(nil, "x"))
    assert.same({ 1, 2 }, old)
  end)

  it("merge merges tables shallowly, new keys win", function()
    local old = { a = 1, b = 2 }
    assert.same({ a = 1, b = 3, c = 4 }, reducers.merge(old, { b = 3, c = 4 }))
    assert.same({ a = 1, b = 2 }, old)
    assert.has_error(function() reducers.merge(old, 5) end,
      "merge reducer: written value is a number, not a table")
  end)

  it("add sums numbers, nil counts as 0", function()
    assert.equal(5, reducers.add(2, 3))
    assert.equal(3, reducers.add(nil, 3))
    assert.has_error(function() reducers.add(1, "x") end,
      "add reducer: written value is a string, not a number")
  end)

  it("messages appends, replaces by id and deletes with a remove marker", function()
    local m = reducers.messages(nil, { { id = "1", role = "user", content = "hi" },
      { id = "2", role = "assistant", content = "draft" } })
    m = reducers.messages(m, { id = "2", role = "assistant", content = "final" })
    assert.equal(2, #m)
    assert.equal("final", m[2].content)
    m = reducers.messages(m, { id = "3", role = "user", content = "more" })
    m = reducers.messages(m, reducers.remove("1"))
    assert.same({ "2", "3" }, { m[1].id, m[2].id })
    m = reducers.messages(m, reducers.remove(reducers.REMOVE_ALL))
    assert.same({}, m)
  end)

  it("messages gives ids to messages without one and takes strings as user messages", function()
    local m = reducers.messages(nil, "hello")
    assert.equal("user", m[1].role)
    assert.equal("hello", m[1].content)
    assert.is_string(m[1].id)
    local orig = { role = "assistant", content = "x" }
    m = reducers.messages(m, orig)
    assert.is_string(m[2].id)
    assert.is_nil(orig.id)
  end)

  it("removing an unknown message id is an error naming the id", function()
    assert.has_error(function() reducers.messages({}, reducers.remove("nope")) end,
      "messages reducer: cannot remove message 'nope': no message has that id")
  end)

  it("batch forms equal folding the reducer", function()
    for _, name in ipairs { "append", "merge", "add", "messages" } do
      local fn = reducers[name]
      local writes
      if name == "add" then writes = { 1, 2, 3 }
      elseif name == "merge" then writes = { { a = 1 }, { b = 2 }, { a = 3 } }
      else writes = { { id = "a", v = 1 }, { { id = "b", v = 2 } }, { id = "a", v = 3 } } end
      local folded = name == "add" and 10 or nil
      if name == "add" then folded = 0 end
      local start = folded
      for _, w in ipairs(writes) do folded = fn(folded, w) end
      assert.same(folded, reducers.batch[fn](start, writes), name)
    end
  end)
end)

describe("checkpoint json", function()
  it("round-trips integers, floats, strings and nesting exactly", function()
    local v = { i = 3, f = 3.0, x = 0.1 + 0.2, big = 2 ^ 60, neg = -7, s = "a\"b\\c\n\0é",
      list = { 1, { 2 }, {} }, t = true, fl = false }
    local back = json.decode(assert(json.encode(v)))
    assert.same(v, back)
    assert.equal("integer", math.type(back.i))
    assert.equal("float", math.type(back.f))
    assert.equal(0.1 + 0.2, back.x)
  end)

  it("sorts keys, so equal tables encode equally", function()
    assert.equal('{"a":1,"b":2,"c":3}', json.encode { c = 3, a = 1, b = 2 })
  end)

  it("refuses values JSON cannot hold, naming where they are", function()
    local s, err = json.encode({ state = { f = print } }, { name = "checkpoint" })
    assert.is_nil(s)
    assert.equal("checkpoint.state.f is a function, which cannot be saved", err)
    s, err = json.encode { 1, nil, 3 }
    assert.matches("list with holes", err)
    s, err = json.encode { [1] = "a", x = "b" }
    assert.matches("mixes list items and string keys", err)
    s, err = json.encode { v = 0 / 0 }
    assert.matches("value.v is .*JSON cannot hold", err)
    local cyc = {}
    cyc.me = cyc
    s, err = json.encode(cyc)
    assert.matches("contains itself", err)
  end)

  it("reports malformed input", function()
    local v, err = json.decode('{"a": [1, 2}')
    assert.is_nil(v)
    assert.matches("invalid JSON", err)
    assert.is_nil((json.decode("[1] x")))
  end)

  it("decodes unicode escapes and null", function()
    local v = json.decode('{"s":"\\u00e9\\ud83d\\ude00","n":null}')
    assert.equal("é😀", v.s)
    assert.equal(json.null, v.n)
    assert.equal('{"n":null}', json.encode { n = json.null })
  end)
end)

insulate("messages reducer ids across processes", function()
  it("gives fresh ids that do not repeat when the random seed does", function()
    -- each load of the module stands for a new process with the same seed
    local ids = {}
    for i = 1, 2 do
      package.loaded["moongraph.reducers"] = nil
      local reducers = require "moongraph.reducers"
      math.randomseed(42)
      local out = reducers.messages({}, { role = "user", content = "hello" })
      ids[i] = out[1].id
    end
    assert.is_string(ids[1])
    assert.is_string(ids[2])
    assert.are_not.equal(ids[1], ids[2])
  end)
end)
