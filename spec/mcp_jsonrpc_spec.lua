local jsonrpc = require "moongraph.mcp.jsonrpc"
local json = require "moongraph.json"

describe("moongraph.mcp.jsonrpc", function()
  it("classifies requests, notifications and responses", function()
    local m, kind = jsonrpc.decode('{"jsonrpc":"2.0","id":1,"method":"tools/list"}')
    assert.equal("request", kind)
    assert.equal(1, m.id)
    assert.equal("integer", math.type(m.id))
    assert.equal("notification", select(2, jsonrpc.decode('{"jsonrpc":"2.0","method":"notifications/initialized"}')))
    assert.equal("response", select(2, jsonrpc.decode('{"jsonrpc":"2.0","id":"a","result":{}}')))
    assert.equal("response", select(2, jsonrpc.decode('{"jsonrpc":"2.0","id":2,"error":{"code":-32601,"message":"no"}}')))
  end)

  it("gives integral numbers back as integers, others as floats", function()
    local m = jsonrpc.decode('{"jsonrpc":"2.0","id":7,"method":"x","params":{"n":3,"f":1.5,"big":1e300,"l":[1,2.5]}}')
    assert.equal("integer", math.type(m.params.n))
    assert.equal("float", math.type(m.params.f))
    assert.equal("float", math.type(m.params.big))
    assert.equal("integer", math.type(m.params.l[1]))
  end)

  local bad = {
    { "", "not a JSON object" },
    { "garbage", "not a JSON object: garbage" },
    { "[1,2]", "batches" },
    { "{", "malformed JSON" },
    { '{"jsonrpc":"2.0","id":1,"method":"x"} trailing', "malformed JSON" },
    { '{"id":1,"method":"x"}', '"jsonrpc" must be "2.0"' },
    { '{"jsonrpc":"1.0","id":1,"method":"x"}', '"jsonrpc" must be "2.0", got "1.0"' },
    { '{"jsonrpc":"2.0","id":1,"method":5}', '"method" must be a non%-empty string' },
    { '{"jsonrpc":"2.0","id":1,"method":""}', '"method" must be a non%-empty string' },
    { '{"jsonrpc":"2.0","id":1.5,"method":"x"}', "must be a string or an integer" },
    { '{"jsonrpc":"2.0","id":{},"method":"x"}', "must be a string or an integer" },
    { '{"jsonrpc":"2.0","id":1,"method":"x","params":3}', '"params" of x must be an object or an array' },
    { '{"jsonrpc":"2.0"}', 'needs a "method"' },
    { '{"jsonrpc":"2.0","id":1}', 'exactly one of "result" and "error"' },
    { '{"jsonrpc":"2.0","id":1,"result":{},"error":{"code":1,"message":"x"}}', "exactly one of" },
    { '{"jsonrpc":"2.0","id":1,"error":{"message":"x"}}', "integer code and a string message" },
    { '{"jsonrpc":"2.0","id":1,"error":"boom"}', "integer code and a string message" },
    { '{"jsonrpc":"2.0","id":1,"result":[1]}', "must be an object" },
    { '{"jsonrpc":"2.0","id":1,"result":"x"}', "must be an object" },
    { 'null', "not a JSON object" },
    { '{"jsonrpc":"2.0","id":1,"method":"x"' .. string.rep(" ", 10) .. "\0}", "malformed JSON" },
  }
  for _, case in ipairs(bad) do
    it("refuses " .. case[1]:gsub("%z", "\\0"):sub(1, 60), function()
      local m, err = jsonrpc.decode(case[1])
      assert.is_nil(m)
      assert.is_string(err)
      assert.matches(case[2], err)
    end)
  end

  it("never raises on random bytes", function()
    math.randomseed(42)
    for _ = 1, 2000 do
      local n = math.random(0, 40)
      local b = {}
      for i = 1, n do b[i] = string.char(math.random(0, 255)) end
      local s = "{" .. table.concat(b)
      local ok, m, err = pcall(jsonrpc.decode, s)
      assert.is_true(ok)
      assert.is_true(m ~= nil or type(err) == "string")
    end
  end)

  it("shows long garbage shortened, without control characters", function()
    local _, err = jsonrpc.decode("x\27[31m" .. string.rep("y", 500))
    assert.is_true(#err < 200)
    assert.is_nil(err:find("\27", 1, true))
  end)

  it("encodes empty marked lists as [] and empty tables as {}", function()
    local s = jsonrpc.encode(jsonrpc.result(1, { tools = jsonrpc.array(), meta = {}, nested = { l = json.array() } }))
    local v = require("cjson").decode(s)
    assert.matches('"tools":%[%]', s)
    assert.matches('"meta":{}', s)
    assert.matches('"l":%[%]', s)
    assert.equal(1, v.id)
  end)

  it("reports a value JSON cannot hold", function()
    local s, err = jsonrpc.encode({ f = function() end })
    assert.is_nil(s)
    assert.matches("cannot encode as JSON", err)
  end)
end)
