local mg = require "moongraph"
local http = require "moongraph.http"
local cjson = require "cjson"
local testserver = require "testserver"

-- Wait (yielding) until cond() holds; a bounded poll, not a timing assumption.
local function eventually(cond, what)
  local deadline = mg.now() + 20
  while not cond() do
    if mg.now() > deadline then error("never happened: " .. what, 2) end
    mg.sleep(0.01)
  end
end

describe("moongraph.http", function()
  local srv
  setup(function() srv = testserver.start() end)
  teardown(function() srv:stop() end)
  before_each(function() mg.run(function() srv:reset() end) end)

  local function run(fn) return mg.run(fn) end

  describe("requests", function()
    it("GETs a body with status and headers", function()
      local res, err = run(function() return http.get(srv.url .. "/delay?ms=0") end)
      assert.is_nil(err)
      assert.equal(200, res.status)
      assert.equal("ok\n", res.body)
      assert.equal("3", res.headers["content-length"])
    end)

    it("reads response headers case-insensitively", function()
      local res = run(function() return http.get(srv.url .. "/echo") end)
      assert.equal("application/json", res.headers["Content-Type"])
      assert.equal("application/json", res.headers["CONTENT-TYPE"])
      assert.equal("application/json", res.headers["content-type"])
    end)

    it("joins repeated response headers", function()
      run(function()
        srv:script{ path = "/multi", status = 200, body = "x",
                    headers = { ["X-One"] = "a" } }
      end)
      local res = run(function() return http.get(srv.url .. "/multi") end)
      assert.equal("a", res.headers["x-one"])
      assert.equal("x", res.body)
    end)

    it("sends headers given as a map or as lines", function()
      local res = run(function()
        return http.get(srv.url .. "/echo", { headers = { ["X-Map"] = "m", "X-Line: l" } })
      end)
      local echo = res:json()
      assert.equal("m", echo.headers["x-map"])
      assert.equal("l", echo.headers["x-line"])
      assert.matches("^moongraph/", echo.headers["user-agent"])
    end)

    it("lets the caller set the User-Agent", function()
      local res = run(function()
        return http.get(srv.url .. "/echo", { headers = { ["User-Agent"] = "mine/1" } })
      end)
      assert.equal("mine/1", res:json().headers["user-agent"])
    end)

    it("encodes the query table, keeping a query already in the URL", function()
      local res = run(function()
        return http.get(srv.url .. "/echo?z=1", { query = { q = "a b&c", list = { 1, 2 }, t = true } })
      end)
      assert.equal("z=1&list=1&list=2&q=a%20b%26c&t=true", res:json().query)
    end)

    it("POSTs a raw body", function()
      local res = run(function()
        return http.request{ method = "POST", url = srv.url .. "/echo", body = "raw\0bytes",
                             headers = { ["Content-Type"] = "text/plain" } }
      end)
      local echo = res:json()
      assert.equal("POST", echo.method)
      assert.equal("raw\0bytes", echo.body)
      assert.equal("text/plain", echo.headers["content-type"])
      assert.is_nil(echo.headers["expect"])
    end)

    it("sends json as a JSON body with its content type", function()
      local res = run(function() return http.post(srv.url .. "/echo", { a = { 1, 2 } }) end)
      local echo = res:json()
      assert.same({ a = { 1, 2 } }, cjson.decode(echo.body))
      assert.equal("application/json", echo.headers["content-type"])
    end)

    it("keeps a content type given with json", function()
      local res = run(function()
        return http.request{ url = srv.url .. "/echo", json = { x = 1 },
                             headers = { ["content-type"] = "application/vnd.x+json" } }
      end)
      assert.equal("application/vnd.x+json", res:json().headers["content-type"])
    end)

    it("uses other methods, with and without a body", function()
      local out = run(function()
        local o = {}
        for _, m in ipairs{ "PUT", "PATCH", "DELETE" } do
          o[m] = http.request{ method = m, url = srv.url .. "/echo", body = m }:json()
        end
        o.lower = http.request{ method = "delete", url = srv.url .. "/echo" }:json()
        return o
      end)
      assert.equal("PUT", out.PUT.method); assert.equal("PUT", out.PUT.body)
      assert.equal("PATCH", out.PATCH.method)
      assert.equal("DELETE", out.DELETE.method); assert.equal("DELETE", out.DELETE.body)
      assert.equal("DELETE", out.lower.method)
    end)

    it("makes HEAD requests without a body", function()
      local res = run(function() return http.request{ method = "HEAD", url = srv.url .. "/delay" } end)
      assert.equal(200, res.status)
      assert.equal("", res.body)
      assert.equal("3", res.headers["content-length"])
    end)

    it("returns error statuses as responses, not errors", function()
      local res = run(function() return http.get(srv.url .. "/status?code=503") end)
      assert.equal(503, res.status)
      assert.equal(503, res:json().error.code)
    end)

    it("res:json() reports a body that is not JSON", function()
      local v, err = run(function() return http.get(srv.url .. "/delay"):json() end)
      assert.is_nil(v)
      assert.matches("not JSON", err)
    end)

    it("reuses one keep-alive connection for sequential requests", function()
      local opened = run(function()
        http.get(srv.url .. "/delay")
        local before = srv:stats().connections_total
        for _ = 1, 20 do assert(http.get(srv.url .. "/delay")) end
        return srv:stats().connections_total - before
      end)
      assert.equal(0, opened)
    end)
  end)

  describe("redirects", function()
    it("follows redirects by default", function()
      local res = run(function() return http.get(srv.url .. "/redirect?to=/echo") end)
      assert.equal(200, res.status)
      assert.equal("/echo", res:json().path)
    end)

    it("returns the redirect itself with follow_redirects = false", function()
      local res = run(function()
        return http.get(srv.url .. "/redirect?to=/echo", { follow_redirects = false })
      end)
      assert.equal(302, res.status)
      assert.equal("/echo", res.headers.location)
    end)

    it("fails on more redirects than the count allows", function()
      local res, err = run(function()
        return http.get(srv.url .. "/redirect?to=%2Fredirect%3Fto%3D%252Fecho",
                        { follow_redirects = 1 })
      end)
      assert.is_nil(res)
      assert.matches("too many redirects", err)
    end)
  end)

  describe("errors", function()
    it("times out with 'timeout'", function()
      local res, err = run(function()
        return http.get(srv.url .. "/delay?ms=5000", { timeout = 0.2 })
      end)
      assert.is_nil(res)
      assert.matches("^timeout", err)
    end)

    it("connect_timeout bounds the TCP handshake", function()
      local res, err = run(function()
        -- the first connection takes the stall port's only queue slot
        http.get(srv.stall_url .. "/", { timeout = 0.3 })
        return http.get(srv.stall_url .. "/", { connect_timeout = 0.3, timeout = 5 })
      end)
      assert.is_nil(res)
      assert.matches("timeout connecting to 127.0.0.1:%d+", err)
    end)

    it("names the refused host and port", function()
      local res, err = run(function() return http.get("http://127.0.0.1:1/x") end)
      assert.is_nil(res)
      assert.equal("connection refused to 127.0.0.1:1", tostring(err))
      assert.equal("unavailable", err.code)
      assert.is_true(err.retryable)
      assert.equal("127.0.0.1:1", err.details.host)
    end)

    it("never puts the URL's query (keys) in error messages", function()
      local _, err = run(function() return http.get("http://127.0.0.1:1/x?key=SECRET123") end)
      assert.not_matches("SECRET123", err)
      local _, err2 = run(function()
        return http.get(srv.url .. "/delay?ms=5000&serviceKey=SECRET456", { timeout = 0.1 })
      end)
      assert.not_matches("SECRET456", err2)
    end)

    it("reports a connection reset", function()
      local res, err = run(function() return http.get(srv.url .. "/reset") end)
      assert.is_nil(res)
      assert.matches("connection reset by 127.0.0.1:%d+", err)
    end)

    it("reports a truncated body", function()
      local res, err = run(function() return http.get(srv.url .. "/truncate") end)
      assert.is_nil(res)
      assert.matches("truncated response", err)
    end)

    it("reports a connection reset after the request was sent", function()
      -- times = 0: every attempt is reset (curl retries once on a reused
      -- connection that turns out dead)
      run(function() srv:script{ path = "/rst", fault = "reset", times = 0 } end)
      local res, err = run(function() return http.get(srv.url .. "/rst") end)
      assert.is_nil(res)
      assert.matches("connection reset by 127.0.0.1:%d+", err)
    end)

    it("reports an empty reply", function()
      run(function() srv:script{ path = "/empty", fault = "close", times = 0 } end)
      local res, err = run(function() return http.get(srv.url .. "/empty") end)
      assert.is_nil(res)
      assert.matches("empty reply from 127.0.0.1:%d+", err)
    end)

    it("fails a body over max_body, announced or chunked", function()
      local a, b = run(function()
        local _, e1 = http.get(srv.url .. "/bytes?n=1000", { max_body = 100 })
        local _, e2 = http.get(srv.url .. "/bytes?n=1000&chunk=50", { max_body = 100 })
        return e1, e2
      end)
      assert.matches("body exceeds max_body %(100 bytes%)", a)
      assert.matches("body exceeds max_body %(100 bytes%)", b)
    end)

    it("accepts a body of exactly max_body", function()
      local res = run(function() return http.get(srv.url .. "/bytes?n=100&chunk=10", { max_body = 100 }) end)
      assert.equal(100, #res.body)
    end)

    it("could not resolve an unknown host", function()
      local res, err = run(function() return http.get("http://no-such-host.invalid/", { timeout = 5 }) end)
      assert.is_nil(res)
      assert.matches("no%-such%-host%.invalid", err)
    end)
  end)

  describe("misuse", function()
    it("raises for bad options", function()
      run(function()
        assert.has_error(function() http.request{ url = srv.url, timout = 1 } end,
          "bad argument #1 to 'request': unknown option 'timout'")
        assert.has_error(function() http.request{} end,
          "bad argument #1 to 'request': url is required")
        assert.has_error(function() http.request{ url = srv.url, body = "a", json = {} } end,
          "bad argument #1 to 'request': give body or json, not both")
        assert.has_error(function() http.request{ url = srv.url, timeout = "1" } end,
          "bad argument #1 to 'request': timeout must be a number, got string")
        assert.has_error(function() http.request{ url = srv.url, timeout = -1 } end,
          "bad argument #1 to 'http.request' (timeout must be > 0)")
        assert.has_error(function() http.request{ url = srv.url, max_body = 1.5 } end,
          "bad argument #1 to 'request': max_body must be an integer >= 0")
        assert.has_error(function() http.request{ url = "ftp://x/" } end,
          "bad argument #1 to 'http.request' (url must start with http:// or https://)")
        assert.has_error(function() http.get(srv.url, { headers = { ["X"] = "a\r\nInjected: 1" } }) end,
          "bad argument #1 to 'http.request' (header contains CR or LF)")
        assert.has_error(function() http.get(42) end,
          "bad argument #1 to 'get': url string expected, got number")
      end)
    end)

    it("raises a clear error outside a task", function()
      assert.has_error(function() http.get(srv.url .. "/delay") end,
        "http.request: not inside a moongraph task (use mg.run(fn) or mg.spawn(fn); a plain coroutine cannot wait on I/O)")
      local ok, err = pcall(http.get, srv.url .. "/delay")
      assert.is_false(ok)
      assert.matches("not inside a moongraph task", err)
    end)
  end)

  describe("streaming with on_data", function()
    it("delivers chunks before the response ends", function()
      local chunks, res = run(function()
        local chunks = {}
        local res = assert(http.get(srv.url .. "/bytes?n=4000&chunk=1000&hold=go", {
          on_data = function(chunk, r)
            chunks[#chunks + 1] = chunk
            assert.equal(200, r.status)
            -- the server holds the rest until we release it: this chunk
            -- arrived before the response could end
            if #chunks == 1 then srv:release("go") end
          end,
        }))
        return chunks, res
      end)
      assert.is_true(#chunks >= 2)
      assert.equal(4000, #table.concat(chunks))
      assert.equal("", res.body)
      assert.equal("application/octet-stream", res.headers["Content-Type"])
    end)

    it("stops early when on_data returns false", function()
      local res, active = run(function()
        local res = http.get(srv.url .. "/bytes?n=4000&chunk=1000&hold=never", {
          on_data = function() return false end,
        })
        return res, http.stats().active
      end)
      assert.is_true(res.stopped)
      assert.equal(0, active)
    end)

    it("raises on_data's error and removes the transfer", function()
      local ok, err, active = run(function()
        local ok, err = pcall(http.get, srv.url .. "/bytes?n=4000&chunk=1000&hold=never", {
          on_data = function() error("consumer broke") end,
        })
        return ok, err, http.stats().active
      end)
      assert.is_false(ok)
      assert.matches("consumer broke", err)
      assert.equal(0, active)
    end)

    it("returns errors of a streamed transfer", function()
      local res, err = run(function()
        return http.get(srv.url .. "/bytes?n=4000&chunk=1000&hold=never",
                        { timeout = 0.3, on_data = function() end })
      end)
      assert.is_nil(res)
      assert.matches("^timeout", err)
    end)

    it("streams a large body through backpressure", function()
      local total = run(function()
        local n = 0
        assert(http.get(srv.url .. "/bytes?n=8000000&chunk=65536", {
          on_data = function(c) n = n + #c; mg.sleep(0) end,
        }))
        return n
      end)
      assert.equal(8000000, total)
    end)
  end)

  describe("concurrency and cancellation", function()
    it("runs 1000 requests at once without blocking each other", function()
      local statuses, held = run(function()
        local fns = {}
        for i = 1, 1000 do
          fns[i] = function() return http.get(srv.url .. "/delay?hold=all1000", { timeout = 60 }) end
        end
        local t = mg.spawn(mg.gather, fns)
        -- every request reaches the server and waits there at the same time
        local held
        eventually(function() held = srv:stats("all1000").held; return held == 1000 end,
                   "1000 requests held at the server")
        srv:release("all1000")
        local _, out = t:join()
        local statuses = {}
        for i = 1, #out do
          local r = out[i].value
          statuses[r and r.status or tostring(out[i].err)] = (statuses[r and r.status or tostring(out[i].err)] or 0) + 1
        end
        return statuses, held
      end)
      assert.equal(1000, held)
      assert.same({ [200] = 1000 }, statuses)
    end)

    it("cancelling a task removes its transfer", function()
      local during, after = run(function()
        local t = mg.spawn(http.get, srv.url .. "/delay?hold=cancel1")
        eventually(function() return srv:stats("cancel1").held == 1 end, "request held")
        local during = http.stats().active
        t:cancel()
        return during, http.stats()
      end)
      assert.equal(1, during)
      assert.equal(0, after.active)
    end)

    it("cancelling a task mid-stream removes its transfer", function()
      local got, after = run(function()
        local got = 0
        local t = mg.spawn(http.get, srv.url .. "/bytes?n=4000&chunk=1000&hold=never", {
          on_data = function(c) got = got + #c end,
        })
        eventually(function() return got > 0 end, "first chunk")
        t:cancel()
        return got, http.stats()
      end)
      assert.equal(1000, got)
      assert.equal(0, after.active)
    end)

    it("cancelling the task stops a slow request and frees it", function()
      local ok, err, active = run(function()
        local t = mg.spawn(http.get, srv.url .. "/delay?ms=10000")
        mg.sleep(0)   -- the task runs until it waits on the request
        assert.is_true(t:cancel())
        local ok, err = t:join()
        return ok, err, http.stats().active
      end)
      assert.is_false(ok)
      assert.equal("cancelled", err)
      assert.equal(0, active)
    end)

    it("keeps working after cancellations", function()
      local res = run(function()
        for _ = 1, 20 do
          local t = mg.spawn(http.get, srv.url .. "/delay?ms=1000")
          mg.sleep(0)
          t:cancel()
        end
        return http.get(srv.url .. "/delay")
      end)
      assert.equal(200, res.status)
    end)
  end)
end)

describe("moongraph.http over TLS", function()
  local srv
  setup(function() srv = testserver.start{ tls = true } end)
  teardown(function() srv:stop() end)

  it("refuses a self-signed certificate by default", function()
    local res, err = mg.run(function() return http.get(srv.url .. "/delay") end)
    assert.is_nil(res)
    assert.matches("TLS", err)
    assert.matches("localhost:%d+", err)
  end)

  it("accepts it when its CA file is given", function()
    local res, err = mg.run(function() return http.get(srv.url .. "/delay", { ca_file = srv.ca_file }) end)
    assert.is_nil(err)
    assert.equal(200, res.status)
    assert.equal("ok\n", res.body)
  end)

  it("reports an unreadable CA file", function()
    local res, err = mg.run(function()
      return http.get(srv.url .. "/delay", { ca_file = "/nonexistent/ca.pem" })
    end)
    assert.is_nil(res)
    assert.matches("TLS", err)
  end)

  it("streams over TLS", function()
    local n = mg.run(function()
      local n = 0
      assert(http.get(srv.url .. "/bytes?n=100000&chunk=10000", {
        ca_file = srv.ca_file, on_data = function(c) n = n + #c end,
      }))
      return n
    end)
    assert.equal(100000, n)
  end)
end)
