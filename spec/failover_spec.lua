local mg = require "moongraph"
local failover = require "moongraph.failover"

describe("moongraph.failover", function()
  local function route(opts) return mg.run(failover.route, opts) end

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

  it("calls the router with two arguments first, then with a copy of failed_keys", function()
    local calls, copies = {}, {}
    route{
      candidates = { { name = "x" }, { name = "y" }, { name = "z" } },
      router = function(...)
        local e = select(3, ...)
        calls[#calls + 1] = select("#", ...)
        if not e then return "x" end
        copies[#copies + 1] = e.failed_keys
        e.failed_keys.z = true          -- the router's own table: routing ignores it
        return e.failed_keys.x and not e.failed_keys.y and "y" or "z"
      end,
      call = function(k) if k == "z" then return "z ok" end return nil, k .. " down" end,
    }
    assert.same({ 2, 3, 3 }, calls)
    assert.same({ x = true, z = true }, copies[1])
    assert.same({ x = true, y = true, z = true }, copies[2])
    assert.are_not.equal(copies[1], copies[2])
  end)

  it("counts a nil result as a success with ok_flag", function()
    local tried = {}
    local ok, key, a, b = route{
      candidates = { { name = "x" }, { name = "y" } },
      ok_flag = true,
      call = function(k)
        tried[#tried + 1] = k
        if k == "x" then return false, "x down" end
        return true, nil, "second"
      end,
    }
    assert.is_true(ok)
    assert.equal("y", key)
    assert.is_nil(a)
    assert.equal("second", b)
    assert.same({ "x", "y" }, tried)
    local ok2, err2 = route{ candidates = { { name = "x" } }, ok_flag = true,
      call = function() return false, "x down" end }
    assert.is_false(ok2)
    assert.equal("x down", err2)
  end)

  it("lets graph interrupts through untouched with pass_through", function()
    local control = require "moongraph.control"
    local tried = {}
    local ok, err = pcall(route, {
      candidates = { { name = "x" }, { name = "y" } },
      pass_through = true,
      call = function(k)
        tried[#tried + 1] = k
        error(control.interrupt_error { { id = "1:n/1", value = "sure?" } })
      end,
    })
    assert.is_false(ok)
    assert.is_true(control.is_interrupt(err))
    assert.equal("sure?", err[1].value)
    assert.same({ "x" }, tried)          -- not a failure: no failover
  end)

  it("lets the errors a pass_through function names through", function()
    local tried = {}
    local ok, err = pcall(route, {
      candidates = { { name = "x" }, { name = "y" } },
      pass_through = function(e) return type(e) == "table" and e.cancel end,
      call = function(k) tried[#tried + 1] = k; error({ cancel = true }) end,
    })
    assert.is_false(ok)
    assert.same({ cancel = true }, err)
    assert.same({ "x" }, tried)
  end)

  it("names an unknown key and lists the valid ones, without a file position", function()
    local function try(opts) return mg.run(function() return pcall(failover.route, opts) end) end
    local ok, err = try { candidates = { b = 1, a = 2 }, router = function() return "c" end,
      call = function() return 1 end }
    assert.is_false(ok)
    assert.equal("the router returned 'c', which is not one of its candidates (a, b)", err)
    ok, err = try { candidates = { b = 1, a = 2 }, router = function() return "c" end,
      call = function() return 1 end, name = "routed agent 'desk'", what = "agents" }
    assert.equal("routed agent 'desk': the router returned 'c', which is not one of its agents (a, b)", err)
  end)

  it("raises for misuse", function()
    assert.has_error(function() failover.normalize({}) end, "bad argument: candidates is empty")
    assert.has_error(function() failover.normalize({ { name = "a" }, { name = "a" } }) end,
      "bad argument: candidates has two items named 'a'")
    assert.has_error(function() failover.normalize({ {} }) end,
      "bad argument: candidates[1] has no name to use as its key")
    local ok, err = pcall(route, { candidates = { { name = "x" } }, router = function() return "nope" end,
                                   call = function() return 1 end })
    assert.is_false(ok)
    assert.matches("^the router returned 'nope', which is not one of its candidates %(x%)\n", err)
  end)
end)
