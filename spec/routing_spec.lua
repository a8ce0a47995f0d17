local mg = require "moongraph"
local routing = require "moongraph.routing"

describe("moongraph.routing", function()
  local function route(opts) return mg.run(routing.route, opts) end

  it("calls the router without error context first and returns the key used", function()
    local seen
    local res, key = route{
      candidates = { a = "A", b = "B" },
      router = function(c, ctx, ectx) seen = { ctx = ctx, ectx = ectx, a = c.a }; return "b" end,
      context = "ctx",
      call = function(k, item) return item .. "!" end,
    }
    assert.equal("B!", res)
    assert.equal("b", key)
    assert.same({ ctx = "ctx", a = "A" }, seen)
  end)

  it("fails over with failed_keys and last_error, in list order by default", function()
    local tried = {}
    local res, key = route{
      candidates = { { name = "x" }, { name = "y" }, { name = "z" } },
      call = function(k)
        tried[#tried + 1] = k
        if k ~= "z" then return nil, k .. " down" end
        return "ok"
      end,
    }
    assert.equal("ok", res)
    assert.equal("z", key)
    assert.same({ "x", "y", "z" }, tried)
  end)

  it("passes the last error to the router", function()
    local last
    route{
      candidates = { { name = "x" }, { name = "y" } },
      router = function(_, _, e)
        if not e then return "x" end
        last = e
        return "y"
      end,
      call = function(k) if k == "x" then return nil, "x broke" end return true end,
    }
    assert.equal("x broke", last.last_error)
    assert.is_true(last.failed_keys.x)
    assert.is_nil(last.failed_keys.y)
  end)

  it("treats a raised error as a failure and raises the final one again", function()
    local ok, err = pcall(route, {
      candidates = { { name = "x" }, { name = "y" } },
      call = function(k) error({ code = k }) end,
    })
    assert.is_false(ok)
    assert.same({ code = "y" }, err)
  end)

  it("propagates a failure after output was emitted without trying others", function()
    local tried = 0
    local res, err = route{
      candidates = { { name = "x" }, { name = "y" } },
      call = function(_, _, emitted)
        tried = tried + 1
        emitted()
        return nil, "broke mid-stream"
      end,
    }
    assert.is_nil(res)
    assert.equal("broke mid-stream", err)
    assert.equal(1, tried)
  end)

  it("stops when the router returns nil or a failed key", function()
    local res, err = route{
      candidates = { { name = "x" } },
      router = function() return "x" end,
      call = function() return nil, "x down" end,
    }
    assert.is_nil(res)
    assert.equal("x down", err)
    local r2, e2 = route{ candidates = { { name = "x" } }, router = function() return nil end,
                          call = function() return 1 end }
    assert.is_nil(r2)
    assert.equal("router chose no candidate", e2)
  end)

  it("raises for misuse", function()
    assert.has_error(function() routing.normalize({}) end)
    assert.has_error(function() routing.normalize({ { name = "a" }, { name = "a" } }) end)
    assert.has_error(function() routing.normalize({ {} }) end)
    assert.has_error(function()
      route{ candidates = { { name = "x" } }, router = function() return "nope" end,
             call = function() return 1 end }
    end)
  end)
end)
