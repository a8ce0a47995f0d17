-- moongraph.server over the wire: a server in its own process
-- (spec/support/server_app.lua) answering curl and raw sockets. HTTP/1.1
-- behaviour: keep-alive, pipelining, chunked and large bodies, HEAD,
-- 404/405/OPTIONS, limits (413, 414, 431), bad request lines, SSE through
-- curl -N, CORS, the access log and TLS.
local cjson = require "cjson"
local sp = require "serverproc"
local tmp = require "tmp"

local function request(path, extra)
  return "GET " .. path .. " HTTP/1.1\r\nHost: x\r\n" .. (extra or "") .. "\r\n"
end

describe("moongraph.server over HTTP/1.1", function()
  local s
  setup(function()
    s = sp.start{ max_body = 8 * 1024 * 1024, max_header = 4096 }
  end)
  teardown(function()
    s:stop()
  end)

  describe("connections", function()
    it("keeps a connection alive across requests", function()
      local c = s:connect()
      for i = 1, 3 do
        assert(c:send(request("/items/" .. i)))
        local r = assert(sp.read_response(c))
        assert.equal(200, r.status)
        assert.equal(tostring(i), cjson.decode(r.body).id)
        assert.is_nil(r.headers.connection)
      end
      c:close()
    end)

    it("answers pipelined requests in order", function()
      local c = s:connect()
      assert(c:send(request("/items/1") .. request("/nope") .. request("/items/3")))
      local a = assert(sp.read_response(c))
      local b = assert(sp.read_response(c))
      local d = assert(sp.read_response(c))
      assert.same({ 200, 404, 200 }, { a.status, b.status, d.status })
      assert.equal("1", cjson.decode(a.body).id)
      assert.equal("3", cjson.decode(d.body).id)
      c:close()
    end)

    it("closes after answering a request with Connection: close", function()
      local c = s:connect()
      assert(c:send(request("/hello", "Connection: close\r\n")))
      local r = assert(sp.read_response(c))
      assert.equal(200, r.status)
      assert.equal("close", r.headers.connection)
      assert.is_true(sp.read_until_closed(c, 5))
      c:close()
    end)

    it("keeps an HTTP/1.0 connection only when asked", function()
      local c = s:connect()
      assert(c:send("GET /hello HTTP/1.0\r\nConnection: keep-alive\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal("keep-alive", r.headers.connection)
      assert(c:send("GET /hello HTTP/1.0\r\n\r\n"))
      r = assert(sp.read_response(c))
      assert.equal("close", r.headers.connection)
      assert.is_true(sp.read_until_closed(c, 5))
      c:close()
    end)
  end)

  describe("bodies", function()
    it("reads a chunked request body", function()
      local c = s:connect()
      assert(c:send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" ..
                    "5\r\nhello\r\n1\r\n \r\n5\r\nworld\r\n0\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(200, r.status)
      assert.equal("hello world", r.body)
      c:close()
    end)

    it("reads a large body sent by curl (with Expect: 100-continue)", function()
      local blob = string.rep("0123456789abcdef", 5 * 65536)   -- 5 MiB
      local path = tmp.file(blob, "blob")
      local r = s:curl{ "/echo", "--data-binary", "@" .. path, "-H", "Content-Type: application/octet-stream" }
      assert.equal(200, r.status, r.out)
      assert.equal(tostring(#blob), r.headers["x-body-length"])
      assert.is_true(r.body == blob)
    end)

    it("refuses a body over max_body with 413 before reading it", function()
      local c = s:connect()
      assert(c:send("POST /echo HTTP/1.1\r\nHost: x\r\nContent-Length: 9000000\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(413, r.status)
      assert.equal("close", r.headers.connection)
      c:close()
    end)

    it("refuses a chunked body that grows over max_body with 413", function()
      local c = s:connect()
      assert(c:send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"))
      local chunk = string.format("%x\r\n%s\r\n", 1024 * 1024, string.rep("a", 1024 * 1024))
      local status
      for _ = 1, 9 do
        if not c:send(chunk) then break end
      end
      local r = sp.read_response(c)
      status = r and r.status
      assert.equal(413, status)
      c:close()
    end)

    it("answers 400 for a broken chunked body", function()
      local c = s:connect()
      assert(c:send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\nzz\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(400, r.status)
      c:close()
    end)

    it("answers 400 for chunk data not followed by CRLF, however the bytes are split", function()
      local body = "3\r\nabcXY4\r\ndefg\r\n0\r\n\r\n"
      for _, split in ipairs { 0, 8, 9, 10 } do
        local c = s:connect()
        local msg = "POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" .. body
        local head_len = #msg - #body
        if split == 0 then
          assert(c:send(msg))
        else
          assert(c:send(msg:sub(1, head_len + split)))
          assert(c:send(msg:sub(head_len + split + 1)))
        end
        local r = assert(sp.read_response(c))
        assert.equal(400, r.status, "split at " .. split)
        assert.matches("chunk data not followed by CRLF", r.body)
        c:close()
      end
      -- and a well-formed one split the same ways is read whole
      local c = s:connect()
      assert(c:send("POST /echo HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n3\r\nabc\r"))
      assert(c:send("\n4\r\ndefg\r\n0\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(200, r.status)
      assert.equal("abcdefg", r.body)
      c:close()
    end)
  end)

  describe("Host (RFC 9112 3.2)", function()
    local function status_of(text)
      local c = s:connect()
      assert(c:send(text))
      local r = assert(sp.read_response(c))
      c:close()
      return r.status, r.body
    end

    it("refuses an HTTP/1.1 request without Host, with two, or with a value that is no host", function()
      local st, body = status_of("GET /hello HTTP/1.1\r\n\r\n")
      assert.equal(400, st)
      assert.matches("needs a Host header", body)
      st, body = status_of("GET /hello HTTP/1.1\r\nHost: a\r\nHost: b\r\n\r\n")
      assert.equal(400, st)
      assert.matches("more than one Host header", body)
      assert.equal(400, (status_of("GET /hello HTTP/1.0\r\nHost: a\r\nHost: a\r\n\r\n")))
      assert.equal(400, (status_of("GET /hello HTTP/1.1\r\nHost: a b\r\n\r\n")))
      assert.equal(400, (status_of("GET /hello HTTP/1.1\r\nHost: a/b\r\n\r\n")))
    end)

    it("serves a Host with a port or an IP literal, an empty one, and HTTP/1.0 without one", function()
      assert.equal(200, (status_of("GET /hello HTTP/1.1\r\nHost: example.com:8080\r\n\r\n")))
      assert.equal(200, (status_of("GET /hello HTTP/1.1\r\nHost: [::1]:80\r\n\r\n")))
      assert.equal(200, (status_of("GET /hello HTTP/1.1\r\nHost: \r\n\r\n")))
      assert.equal(200, (status_of("GET /hello HTTP/1.0\r\n\r\n")))
    end)
  end)

  describe("request ids", function()
    it("answers every response with X-Request-Id: the client's own when it is a plain token", function()
      local r = s:curl { "/hello", "-H", "X-Request-Id: trace-abc_123" }
      assert.equal("trace-abc_123", r.headers["x-request-id"])
      local mine = s:curl { "/hello", "-H", "X-Request-Id: " .. string.rep("x", 65) }
      assert.matches("^%x+%-%x+$", mine.headers["x-request-id"])
      local bad = s:curl { "/hello", "-H", "X-Request-Id: a b" }
      assert.matches("^%x+%-%x+$", bad.headers["x-request-id"])
      -- answers made in C carry one too
      local nf = s:curl { "/nothing-here" }
      assert.equal(404, nf.status)
      assert.matches("^%x+%-%x+$", nf.headers["x-request-id"])
      assert.not_equal(nf.headers["x-request-id"], bad.headers["x-request-id"])
    end)
  end)

  describe("methods and routes", function()
    it("answers HEAD with the GET route's headers and no body", function()
      local c = s:connect()
      assert(c:send("HEAD /hello HTTP/1.1\r\nHost: x\r\n\r\n" .. request("/items/7")))
      local h = assert(sp.read_response(c, true))
      assert.equal(200, h.status)
      assert.equal(tostring(#'{"hello":"world"}'), h.headers["content-length"])
      assert.equal("application/json", h.headers["content-type"])
      -- the next response starts right after the head: no body was sent
      local r = assert(sp.read_response(c))
      assert.equal("7", cjson.decode(r.body).id)
      c:close()
    end)

    it("answers 404 with a JSON error", function()
      local r = s:curl{ "/no/such/thing" }
      assert.equal(404, r.status)
      assert.equal("application/json", r.headers["content-type"])
      assert.same({ error = "not found" }, cjson.decode(r.body))
    end)

    it("answers 405 with Allow listing the path's methods", function()
      local r = s:curl{ "-X", "PATCH", s.url .. "/items/3" }
      assert.equal(405, r.status)
      assert.equal("DELETE, GET, HEAD, OPTIONS", r.headers.allow)
    end)

    it("answers OPTIONS with 204 and Allow", function()
      local r = s:curl{ "-X", "OPTIONS", s.url .. "/echo" }
      assert.equal(204, r.status)
      assert.equal("POST, PUT, OPTIONS", r.headers.allow)
    end)

    it("decodes params and query strings", function()
      local r = s:curl{ "/items/caf%C3%A9%2Fbar?x=1%2B1&y=a+b&y=c&z" }
      assert.equal(200, r.status)
      local v = cjson.decode(r.body)
      assert.equal("café/bar", v.id)
      assert.same({ x = "1+1", y = { "a b", "c" }, z = "" }, v.query)
    end)

    it("gives a *rest parameter the rest of the path", function()
      local r = s:curl{ "/files/a/b%20c/d.txt" }
      assert.same({ rest = "a/b c/d.txt" }, cjson.decode(r.body))
    end)

    it("reads request headers case-insensitively", function()
      local r = s:curl{ "/headers", "-A", "spec-agent/1", "-H", "X-Mixed-Case: yes" }
      local v = cjson.decode(r.body)
      assert.equal("spec-agent/1", v.agent)
      assert.equal("yes", v.headers["x-mixed-case"])
    end)

    it("sends 204 without a body", function()
      local c = s:connect()
      assert(c:send("DELETE /items/1 HTTP/1.1\r\nHost: x\r\n\r\n" .. request("/items/2")))
      local r = assert(sp.read_response(c))
      assert.equal(204, r.status)
      assert.is_nil(r.headers["content-length"])
      local r2 = assert(sp.read_response(c))
      assert.equal(200, r2.status)
      c:close()
    end)
  end)

  describe("bad requests", function()
    it("answers a malformed request line with 400 and closes", function()
      local c = s:connect()
      assert(c:send("GARBAGE\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(400, r.status)
      assert.equal("close", r.headers.connection)
      assert.is_true(sp.read_until_closed(c, 5))
      c:close()
    end)

    it("answers a header name that is not a token with 400", function()
      local c = s:connect()
      assert(c:send(request("/hello", "Bad Name: 1\r\n")))
      local r = assert(sp.read_response(c))
      assert.equal(400, r.status)
      assert.same({ error = "invalid header field name" }, cjson.decode(r.body))
      c:close()
    end)

    it("answers an unsupported HTTP version with 505", function()
      local c = s:connect()
      assert(c:send("GET /hello HTTP/2.0\r\nHost: x\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(505, r.status)
      c:close()
    end)

    it("answers headers over max_header with 431", function()
      local c = s:connect()
      assert(c:send(request("/hello", "X-Big: " .. string.rep("b", 5000) .. "\r\n")))
      local r = assert(sp.read_response(c))
      assert.equal(431, r.status)
      assert.is_true(sp.read_until_closed(c, 5))
      c:close()
    end)

    it("answers more than 100 header lines with 431", function()
      local lines = {}
      for i = 1, 101 do lines[i] = "X-H" .. i .. ": 1\r\n" end
      local c = s:connect()
      assert(c:send(request("/hello", table.concat(lines))))
      local r = assert(sp.read_response(c))
      assert.equal(431, r.status)
      c:close()
    end)

    it("answers a request-target over max_header with 414", function()
      local c = s:connect()
      assert(c:send(request("/items/" .. string.rep("x", 5000))))
      local r = assert(sp.read_response(c))
      assert.equal(414, r.status)
      c:close()
    end)

    it("answers a path with a broken percent-escape with 400", function()
      local c = s:connect()
      assert(c:send(request("/items/%zz")))
      local r = assert(sp.read_response(c))
      assert.equal(400, r.status)
      c:close()
    end)

    it("keeps serving other clients after all of these", function()
      local r = s:curl{ "/hello" }
      assert.equal(200, r.status)
      assert.is_true(s:alive())
    end)
  end)

  describe("server-sent events", function()
    it("streams events to curl -N as they are written", function()
      local r = s:curl({ "-N", s.url .. "/sse?n=3&every=0.05" }, { raw = true })
      assert.is_true(r.ok, r.out)
      assert.equal("event: tick\nid: 1\ndata: {\"i\":1}\n\n" ..
                   "event: tick\nid: 2\ndata: {\"i\":2}\n\n" ..
                   "event: tick\nid: 3\ndata: {\"i\":3}\n\n", r.out)
    end)
  end)
end)

describe("moongraph.server options", function()
  it("adds CORS headers for allowed origins and answers preflights", function()
    local s = sp.start{ cors = { origins = { "https://app.example" }, max_age = 60 } }
    local pre = s:curl{ "-X", "OPTIONS", s.url .. "/echo", "-H", "Origin: https://app.example",
                        "-H", "Access-Control-Request-Method: POST",
                        "-H", "Access-Control-Request-Headers: content-type" }
    local ok = s:curl{ "/hello", "-H", "Origin: https://app.example" }
    local other = s:curl{ "/hello", "-H", "Origin: https://evil.example" }
    s:stop()
    assert.equal(204, pre.status)
    assert.equal("https://app.example", pre.headers["access-control-allow-origin"])
    assert.equal("POST, PUT, OPTIONS", pre.headers["access-control-allow-methods"])
    assert.equal("content-type", pre.headers["access-control-allow-headers"])
    assert.equal("60", pre.headers["access-control-max-age"])
    assert.equal("https://app.example", ok.headers["access-control-allow-origin"])
    assert.equal("Origin", ok.headers.vary)
    assert.is_nil(other.headers["access-control-allow-origin"])
  end)

  it("allows any origin with cors = true", function()
    local s = sp.start{ cors = true }
    local r = s:curl{ "/hello", "-H", "Origin: https://anything.example" }
    s:stop()
    assert.equal("*", r.headers["access-control-allow-origin"])
  end)

  it("writes one JSON access log line per request, without the query string", function()
    local log = tmp.path("access.log")
    local s = sp.start{ log = log }
    s:curl{ "/items/5?api_key=secret" }
    s:curl{ "/nope" }
    s:stop()
    local lines = {}
    for line in io.lines(log) do lines[#lines + 1] = cjson.decode(line) end
    assert.equal(2, #lines)
    local a, b = lines[1], lines[2]
    assert.equal("GET", a.method)
    assert.equal("/items/5", a.path)
    assert.equal(200, a.status)
    assert.is_true(a.bytes > 0)
    assert.is_number(a.ms)
    assert.equal("127.0.0.1", a.remote)
    assert.matches("^%d%d%d%d%-%d%d%-%d%dT", a.time)
    assert.equal(404, b.status)
  end)

  describe("with TLS", function()
    local dir, cert, key
    setup(function()
      dir = tmp.dir("tls")
      cert, key = dir .. "/cert.pem", dir .. "/key.pem"
      assert(os.execute(string.format("env -u LD_PRELOAD openssl req -x509 -newkey rsa:2048 -nodes -days 1 " ..
        "-subj /CN=localhost -addext subjectAltName=DNS:localhost,IP:127.0.0.1 " ..
        "-keyout %s -out %s >/dev/null 2>&1", key, cert)))
    end)

    it("serves HTTPS with the given certificate and key", function()
      local s = sp.start{ tls = { cert = cert, key = key } }
      assert.matches("^https://", s.url)
      local r = s:curl{ "/hello", "--cacert", cert }
      local v = s:curl({ "-v", "--cacert", cert, s.url .. "/hello" }, { raw = true })
      local plain = s:curl({ "http://127.0.0.1:" .. s.port .. "/hello" }, { raw = true })
      s:stop()
      assert.equal(200, r.status, r.out)
      assert.same({ hello = "world" }, cjson.decode(r.body))
      assert.matches("ALPN: server accepted http/1.1", v.out, 1, true)
      assert.is_falsy(plain.ok)
    end)

    it("fails to start with a message when the key does not exist", function()
      local ok, err = pcall(sp.start, { tls = { cert = cert, key = dir .. "/missing.pem" } })
      assert.is_false(ok)
      assert.matches("tls: cannot use key '" .. dir .. "/missing.pem'", err, 1, true)
    end)
  end)
end)
