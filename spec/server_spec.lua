-- moongraph.server in this process, driven by moongraph.http (libcurl) on
-- the same loop: the Lua API, handlers in tasks, responses and streams,
-- close and drain. Protocol edge cases and bad clients, with curl and raw
-- sockets against a server in its own process, are in
-- spec/server_http_spec.lua, spec/server_clients_spec.lua and
-- spec/server_static_spec.lua.
local mg = require "moongraph"
local server = require "moongraph.server"
local http = require "moongraph.http"
local cjson = require "cjson"

-- listen with the signal watcher off: this process is the test runner
local function listen(opts)
  opts.signals = false
  return assert(server.listen(opts))
end

describe("moongraph.server", function()
  describe("listen", function()
    it("binds a free port when given port 0 and reports it", function()
      mg.run(function()
        local srv = listen{ port = 0, routes = {} }
        assert.is_true(srv.port > 0)
        assert.equal("http://127.0.0.1:" .. srv.port, srv.url)
        srv:close()
      end)
    end)

    it("raises on misuse, naming the option", function()
      local cases = {
        { { nope = 1 }, "unknown option 'nope'" },
        { { port = "80" }, "port must be an integer" },
        { { routes = { ["/x"] = function() end } }, "must look like \"GET /path\"" },
        { { routes = { ["get /x"] = function() end } }, "method must be upper case" },
        { { routes = { ["GET /x"] = "f" } }, "must map to a function" },
        { { routes = { ["FETCH /x"] = function() end } }, "unknown method 'FETCH'" },
        { { routes = { ["GET /x/:a"] = function() end, ["GET /x/:b"] = function() end } },
          "match the same requests" },
        { { routes = { ["GET /x/*rest/y"] = function() end } }, "must be the last segment" },
        { { header_timeout = 0 }, "header_timeout must be > 0" },
        { { cors = { origin = "x" } }, "cors: unknown field 'origin'" },
        { { watchdog = -1 }, "watchdog must be 0 to 1e9 seconds" },
        { { watchdog = 0 / 0 }, "watchdog must be 0 to 1e9 seconds" },
        { { watchdog = math.huge }, "watchdog must be 0 to 1e9 seconds" },
        { { watchdog = "5" }, "watchdog must be 0 to 1e9 seconds" },
      }
      mg.run(function()
        for _, case in ipairs(cases) do
          case[1].signals = false
          local ok, err = pcall(server.listen, case[1])
          assert.is_false(ok, case[2])
          assert.matches("bad argument #1 to 'listen'", err, 1, true)
          assert.matches(case[2], err, 1, true)
        end
      end)
    end)

    it("returns nil and a message when the port is taken", function()
      mg.run(function()
        local a = listen{ port = 0 }
        local b, err = server.listen{ port = a.port, signals = false }
        assert.is_nil(b)
        assert.matches("listen on 127.0.0.1:" .. a.port .. ": address already in use", err, 1, true)
        a:close()
      end)
    end)

    it("returns nil and a message when the static directory is missing", function()
      mg.run(function()
        local srv, err = server.listen{ static = "/nonexistent/dir", signals = false }
        assert.is_nil(srv)
        assert.matches("static directory '/nonexistent/dir'", err, 1, true)
      end)
    end)
  end)

  describe("requests", function()
    it("gives a handler the method, path, decoded params and query", function()
      local got = mg.run(function()
        local seen
        local srv = listen{ routes = {
          ["GET /users/:id/posts/:post"] = function(req)
            seen = req
            return { json = { ok = true } }
          end,
        } }
        local res = assert(http.get(srv.url .. "/users/a%20b/posts/%E2%9C%93?q=x+y&tag=1&tag=2&flag&e=%3D"))
        assert.equal(200, res.status)
        srv:close()
        return seen
      end)
      assert.equal("GET", got.method)
      assert.equal("/users/a b/posts/✓", got.path)
      assert.same({ id = "a b", post = "✓" }, got.params)
      assert.same({ q = "x y", tag = { "1", "2" }, flag = "", e = "=" }, got.query)
    end)

    it("reads headers case-insensitively and joins repeated ones", function()
      local got = mg.run(function()
        local seen
        local srv = listen{ routes = { ["GET /h"] = function(req)
          seen = { req.headers["X-Thing"], req.headers["x-thing"], req.headers.accept, req.headers.missing }
          return { status = 204 }
        end } }
        assert(http.request{ url = srv.url .. "/h", headers = { "X-Thing: a", "x-thing: b", "Accept: text/plain" } })
        srv:close()
        return seen
      end)
      assert.same({ "a, b", "a, b", "text/plain" }, got)
    end)

    it("gives the body and decodes it with req:json(), or says why not", function()
      local res1, res2 = mg.run(function()
        local srv = listen{ routes = { ["POST /j"] = function(req)
          local v, err = req:json()
          if v == nil then return { status = 400, json = { error = err, body = req.body } } end
          return { status = 201, json = { got = v, size = #req.body } }
        end } }
        local a = assert(http.post(srv.url .. "/j", { n = 1, list = { "x" } }))
        local b = assert(http.post(srv.url .. "/j", "{not json"))
        srv:close()
        return a, b
      end)
      assert.equal(201, res1.status)
      assert.same({ got = { n = 1, list = { "x" } }, size = #'{"list":["x"],"n":1}' }, res1:json())
      assert.equal(400, res2.status)
      local e = res2:json()
      assert.matches("^request body is not JSON", e.error)
      assert.equal("{not json", e.body)
    end)
  end)

  describe("answers", function()
    it("sends a returned status, headers and body", function()
      local res = mg.run(function()
        local srv = listen{ routes = { ["PUT /x"] = function()
          return { status = 202, headers = { ["X-One"] = "1", ["Set-Cookie"] = { "a=1", "b=2" } },
                   body = "accepted" }
        end } }
        local r = assert(http.request{ method = "PUT", url = srv.url .. "/x", body = "" })
        srv:close()
        return r
      end)
      assert.equal(202, res.status)
      assert.equal("1", res.headers["x-one"])
      assert.equal("a=1, b=2", res.headers["set-cookie"])
      assert.equal("text/plain; charset=utf-8", res.headers["content-type"])
      assert.equal("accepted", res.body)
    end)

    it("encodes a returned json value with its content type", function()
      local res = mg.run(function()
        local srv = listen{ routes = { ["GET /j"] = function()
          return { status = 201, json = { list = { 1, 2 }, name = "x" } }
        end } }
        local r = assert(http.get(srv.url .. "/j"))
        srv:close()
        return r
      end)
      assert.equal(201, res.status)
      assert.equal("application/json", res.headers["content-type"])
      assert.same({ list = { 1, 2 }, name = "x" }, res:json())
    end)

    it("answers 500 when a handler raises, and goes on serving", function()
      local a, b = mg.run(function()
        local srv = listen{ routes = {
          ["GET /boom"] = function() error("kaboom") end,
          ["GET /ok"] = function() return "fine" end,
        } }
        local r1 = assert(http.get(srv.url .. "/boom"))
        local r2 = assert(http.get(srv.url .. "/ok"))
        srv:close()
        return r1, r2
      end)
      assert.equal(500, a.status)
      local rid = a.headers["x-request-id"]
      assert.matches("^%x+%-%x+$", rid)
      -- the client gets the request id, never the error
      assert.same({ error = "internal server error", request_id = rid }, a:json())
      assert.equal(200, b.status)
      assert.is_truthy(b.headers["x-request-id"])
      assert.not_equal(rid, b.headers["x-request-id"])
      assert.equal("fine", b.body)
    end)

    it("answers 500 when a handler returns nothing and streamed nothing", function()
      local res = mg.run(function()
        local srv = listen{ routes = { ["GET /n"] = function() end } }
        local r = assert(http.get(srv.url .. "/n"))
        srv:close()
        return r
      end)
      assert.equal(500, res.status)
    end)

    it("answers 500 for a header value with a line break instead of sending it", function()
      local res = mg.run(function()
        local srv = listen{ routes = { ["GET /bad"] = function()
          return { headers = { ["X-Evil"] = "a\r\nInjected: yes" }, body = "x" }
        end } }
        local r = assert(http.get(srv.url .. "/bad"))
        srv:close()
        return r
      end)
      assert.equal(500, res.status)
      assert.is_nil(res.headers["injected"])
    end)
  end)

  describe("handlers in tasks", function()
    it("lets a handler wait while other requests are served", function()
      local order = mg.run(function()
        local q = mg.queue()
        local log = {}
        local srv = listen{ routes = {
          ["GET /wait"] = function()
            log[#log + 1] = "wait started"
            local v = q:get(5)
            log[#log + 1] = "wait got " .. tostring(v)
            return { json = { v = v } }
          end,
          ["POST /put"] = function(req)
            log[#log + 1] = "put"
            q:put(req.body)
            return { status = 204 }
          end,
        } }
        local waiting = mg.spawn(http.get, srv.url .. "/wait")
        while #log == 0 do mg.sleep(0.001) end
        local put = assert(http.post(srv.url .. "/put", "hello"))
        assert.equal(204, put.status)
        local ok, res = waiting:join()
        assert.is_true(ok)
        assert.same({ v = "hello" }, res:json())
        srv:close()
        return log
      end)
      assert.same({ "wait started", "put", "wait got hello" }, order)
    end)

    it("lets a handler call out over HTTP (to this same server)", function()
      local res = mg.run(function()
        local srv
        srv = listen{ routes = {
          ["GET /inner"] = function() return { json = { n = 41 } } end,
          ["GET /outer"] = function()
            local r = assert(http.get(srv.url .. "/inner"))
            return { json = { n = r:json().n + 1 } }
          end,
        } }
        local r = assert(http.get(srv.url .. "/outer"))
        srv:close()
        return r
      end)
      assert.same({ n = 42 }, res:json())
    end)
  end)

  describe("streaming", function()
    it("sends res:write chunks in order, chunked", function()
      local res, chunks = mg.run(function()
        local srv = listen{ routes = { ["GET /s"] = function(_, res)
          res:start(201, { ["X-Stream"] = "yes" })
          for i = 1, 5 do
            assert(res:write("part" .. i .. ";"))
            mg.sleep(0.01)
          end
        end } }
        local got = {}
        local r = assert(http.request{ url = srv.url .. "/s", on_data = function(c) got[#got + 1] = c end })
        srv:close()
        return r, got
      end)
      assert.equal(201, res.status)
      assert.equal("yes", res.headers["x-stream"])
      assert.equal("chunked", res.headers["transfer-encoding"])
      assert.equal("part1;part2;part3;part4;part5;", table.concat(chunks))
      assert.is_true(#chunks >= 2)
    end)

    it("formats res:sse events: event, id, JSON data, multi-line data, retry, comment", function()
      local res = mg.run(function()
        local srv = listen{ routes = { ["GET /e"] = function(_, res)
          assert(res:sse{ comment = "hello" })
          assert(res:sse{ event = "token", id = "1", data = { text = "hi" } })
          assert(res:sse{ data = "line one\nline two" })
          assert(res:sse{ retry = 1500, data = "" })
        end } }
        local r = assert(http.get(srv.url .. "/e"))
        srv:close()
        return r
      end)
      assert.equal(200, res.status)
      assert.equal("text/event-stream", res.headers["content-type"])
      assert.equal("no-cache", res.headers["cache-control"])
      assert.equal(": hello\n\n" ..
                   "event: token\nid: 1\ndata: {\"text\":\"hi\"}\n\n" ..
                   "data: line one\ndata: line two\n\n" ..
                   "retry: 1500\ndata: \n\n", res.body)
    end)

    it("raises on an event field with a line break", function()
      local err = mg.run(function()
        local e
        local srv = listen{ routes = { ["GET /e"] = function(_, res)
          local ok, msg = pcall(res.sse, res, { event = "a\nb", data = "x" })
          e = not ok and msg
          res:finish()
        end } }
        assert(http.get(srv.url .. "/e"))
        srv:close()
        return e
      end)
      assert.matches("bad argument #1 to 'sse': event must be one line", err, 1, true)
    end)

    it("raises on a write after the response was finished", function()
      local err = mg.run(function()
        local e
        local srv = listen{ routes = { ["GET /f"] = function(_, res)
          res:write("a")
          res:finish()
          local ok, msg = pcall(res.write, res, "b")
          e = not ok and msg
        end } }
        local r = assert(http.get(srv.url .. "/f"))
        assert.equal("a", r.body)
        srv:close()
        return e
      end)
      assert.matches("write: the response was already finished", err, 1, true)
    end)

    it("returns nil, \"closed\" from write once the client has gone, without cancelling other handlers", function()
      local result, other = mg.run(function()
        local stopped = mg.queue()
        local srv = listen{ routes = {
          ["GET /forever"] = function(_, res)
            local n = 0
            while true do
              local ok, err = res:write(string.rep("z", 1000))
              if not ok then
                stopped:put({ writes = n, err = err })
                return
              end
              n = n + 1
              mg.sleep(0.005)
            end
          end,
          ["GET /slow"] = function()
            mg.sleep(0.2)
            return "still here"
          end,
        } }
        local slow = mg.spawn(http.get, srv.url .. "/slow")
        -- the client reads a little, then goes away
        local got = 0
        http.request{ url = srv.url .. "/forever", on_data = function(c)
          got = got + #c
          return got < 5000
        end }
        local r = stopped:get(10)
        local ok, sres = slow:join()
        srv:close()
        return r, ok and sres
      end)
      assert.is_table(result, "the handler never saw its client go")
      assert.equal("closed", result.err)
      assert.is_true(result.writes >= 5)
      assert.is_table(other)
      assert.equal("still here", other.body)
    end)
  end)

  describe("close and drain", function()
    it("close() closes connections and cancels handlers still running", function()
      local state = mg.run(function()
        local entered = mg.queue()
        local task_state = {}
        local srv
        srv = listen{ routes = { ["GET /hang"] = function()
          task_state.task = mg.current()
          entered:put(true)
          mg.sleep(60)
          task_state.finished = true
          return "never"
        end } }
        local client = mg.spawn(http.get, srv.url .. "/hang")
        assert(entered:get(5))
        srv:close()
        local ok, res, err = client:join()
        assert.is_true(ok)
        task_state.client = res and res.status or err
        task_state.status = task_state.task:status()
        srv:wait()   -- returns at once: the server is closed
        return task_state
      end)
      assert.is_nil(state.finished)
      assert.equal("cancelled", state.status)
      assert.equal("unavailable", state.client.code)   -- the client saw the connection end
    end)

    it("drain() lets a request in flight finish and refuses new connections", function()
      local got = mg.run(function()
        local entered = mg.queue()
        local srv = listen{ routes = { ["GET /slow"] = function()
          entered:put(true)
          mg.sleep(0.2)
          return "done"
        end } }
        local inflight = mg.spawn(http.get, srv.url .. "/slow")
        assert(entered:get(5))
        local drained = mg.spawn(srv.drain, srv, 5)
        local _, res = inflight:join()
        local _, ok = drained:join()
        local late, err = http.get(srv.url .. "/slow", { timeout = 2 })
        return { status = res and res.status, body = res and res.body, drained = ok,
                 late = late, err = err, closed = srv.closed }
      end)
      assert.equal(200, got.status)
      assert.equal("done", got.body)
      assert.is_true(got.drained)
      assert.is_nil(got.late)
      assert.matches("connection refused", got.err, 1, true)
      assert.is_true(got.closed)
    end)

    it("drain() cuts streams still open when the grace period ends", function()
      local got = mg.run(function()
        local ended = mg.queue()
        local srv = listen{ routes = { ["GET /s"] = function(_, res)
          while true do
            local ok, err = res:sse{ data = "tick" }
            if not ok then ended:put(err) return end
            mg.sleep(0.02)
          end
        end } }
        local events = 0
        local client = mg.spawn(http.request, { url = srv.url .. "/s", on_data = function(c)
          local _, n = c:gsub("data: tick", "")
          events = events + n
        end })
        while events < 2 do mg.sleep(0.005) end
        local before = events
        local finished_in_time = srv:drain(0.2)
        local ok, res, err = client:join()
        return { in_time = finished_in_time, before = before, after = events,
                 client_ok = ok, client_err = err, res = res }
      end)
      assert.is_false(got.in_time)
      assert.is_true(got.after > got.before, "the stream went on during the grace period")
      assert.is_nil(got.res)
      assert.equal("unavailable", got.client_err.code)
    end)
  end)
end)
