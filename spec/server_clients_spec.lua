-- moongraph.server against bad and slow clients, with the server in its own
-- process (spec/support/server_app.lua) so that blocking sockets and curl
-- can drive it: a client that sends its headers a byte at a time, one that
-- opens 2,000 connections and sends nothing, one that reads a stream
-- slowly, idle keep-alive connections, and SIGTERM's graceful drain. Each
-- server uses short limits so that nothing here waits long; every wait is a
-- poll with a generous bound (sp.wait_until), never a sleep standing in for
-- synchronisation.
local cjson = require "cjson"
local socket = require "socket"
local sp = require "serverproc"

-- Send `text` one byte every `every` seconds until the server answers or
-- closes; returns what it sent and the response (or nil, err).
local function dribble(c, text, every, bound)
  local deadline = socket.gettime() + bound
  local sent = 0
  while socket.gettime() < deadline do
    local readable = socket.select({ c }, nil, 0)
    if #readable > 0 then break end
    if sent < #text then
      local ok = c:send(text:sub(sent + 1, sent + 1))
      if not ok then break end     -- the server has closed
      sent = sent + 1
    end
    socket.sleep(every)            -- the client's own pace, not a wait for the server
  end
  assert(socket.gettime() < deadline, "the server neither answered nor closed in " .. bound .. " s")
  return sent, sp.read_response(c)
end

describe("moongraph.server with bad clients", function()
  describe("a client that sends its headers one byte at a time", function()
    local s
    before_each(function() s = sp.start{ header_timeout = 0.5 } end)
    after_each(function() s:stop() end)

    it("gets 408 once header_timeout has passed, however it keeps sending, and is closed", function()
      local c = s:connect()
      local head = "GET /hello HTTP/1.1\r\nHost: x\r\nX-Pad: " .. string.rep("p", 200) .. "\r\n\r\n"
      local t0 = socket.gettime()
      local sent, r = dribble(c, head, 0.05, 10)
      local took = socket.gettime() - t0
      assert.is_table(r, "no response before the close")
      assert.equal(408, r.status)
      assert.equal("close", r.headers.connection)
      assert.same({ error = "request header timeout" }, cjson.decode(r.body))
      assert.is_true(sent < #head, "the whole head went through: the timeout never fired")
      assert.is_true(took >= 0.4, "answered before the timeout: " .. took)
      assert.is_true(sp.read_until_closed(c, 5))
      c:close()
    end)

    it("is closed without an answer when it sends nothing at all", function()
      local c = s:connect()
      local ok, partial = sp.read_until_closed(c, 10)
      assert.is_true(ok)
      assert.equal("", partial)
      c:close()
    end)

    it("does not hold up other clients meanwhile", function()
      local slow = s:connect()
      assert(slow:send("GET /hel"))
      for _ = 1, 5 do
        assert.equal(200, s:curl{ "/hello" }.status)
      end
      local r = assert(sp.read_response(slow))
      assert.equal(408, r.status)
      slow:close()
    end)
  end)

  describe("a client that opens 2,000 connections and sends nothing", function()
    it("is held to max_connections while the server answers others, in bounded memory", function()
      local MAX, N = 300, 2000
      local s = sp.start{ max_connections = MAX, header_timeout = 60 }
      -- four client processes of 500 connections each: within the common
      -- default of 1,024 descriptors per process
      local K = 4
      local helpers, outs = {}, {}
      finally(function()   -- busted keeps one finally per test
        for _, h in pairs(helpers) do h:close() end
        s:stop()
      end)
      local rss0 = s:status("VmRSS")
      for k = 1, K do
        outs[k] = s.dir .. "/idle_clients" .. k .. ".out"
        helpers[k] = assert(io.popen(string.format("exec lua5.4 spec/support/idle_clients.lua 127.0.0.1 %d %d > %s",
          s.port, N // K, outs[k]), "w"))
      end
      local function read(k)
        local f = io.open(outs[k])
        local text = f and f:read("a") or ""
        if f then f:close() end
        return text
      end
      local opened = 0
      for k = 1, K do
        local n = sp.wait_until(function()
          local text = read(k)
          return text:match("^opened (%d+)") or text:match("^failed.*")
        end, 60, "the idle clients to connect")
        assert.equal(tostring(N // K), n)
        opened = opened + tonumber(n)
      end
      assert.equal(N, opened)
      -- the server keeps answering while they hold their connections
      local answers = {}
      for i = 1, 5 do answers[i] = s:curl{ "/hello" }.status end
      local st = s:stats()
      local rss1 = s:status("VmRSS")
      local closed = 0
      for k = 1, K do
        helpers[k]:close()
        helpers[k] = nil
        local c = tonumber(read(k):match("closed_by_server (%d+)"))
        assert.is_number(c, read(k))
        closed = closed + c
      end
      assert.same({ 200, 200, 200, 200, 200 }, answers)
      assert.is_true(st.connections <= MAX, "connections: " .. st.connections)
      assert.is_true(st.connections_total >= N + 5)
      assert.is_true(closed >= N - MAX, "the server closed only " .. closed .. " of " .. N)
      -- memory: the connections it holds, not the ones it was offered
      local grew = rss1 - rss0
      assert.is_true(grew < MAX * 64, string.format("RSS grew %d kB for %d connections held", grew, MAX))
    end)
  end)

  describe("a client that reads a stream slowly", function()
    local s
    local BUFFER = 16384
    before_each(function()
      -- under ASan (make asan) freed memory waits in a quarantine instead of
      -- being reused, which would count every string ever written as RSS
      local asan = os.getenv("ASAN_OPTIONS")
      s = sp.start({ stream_buffer = BUFFER, send_timeout = 30 },
                   asan and ("ASAN_OPTIONS=" .. asan .. ":quarantine_size_mb=0") or nil)
    end)
    after_each(function() s:stop() end)

    for _, mode in ipairs{ "sse", "write" } do
      it("makes res:" .. mode .. " wait, so the server holds at most stream_buffer bytes for it", function()
        local c = s:connect(10)
        local rss0 = s:status("VmRSS")
        local N, SIZE = 8000, 1024        -- 8 MiB in all
        assert(c:send("GET /flood?n=" .. N .. "&size=" .. SIZE .. (mode == "sse" and "&sse=1" or "") ..
                      " HTTP/1.1\r\nHost: x\r\n\r\n"))
        -- the client reads nothing: the handler ends up waiting in write
        local st = sp.wait_until(function()
          local v = s:stats()
          return v.writers_waiting == 1 and v
        end, 10, "the handler to wait for its slow client")
        local rss1 = s:status("VmRSS")
        -- one more event may be queued over the threshold before write waits
        assert.is_true(st.buffered <= BUFFER + SIZE + 64, "buffered " .. st.buffered)
        assert.is_true(st.buffered > 0)
        -- read a little at a time; the server stays within its bound
        local got = {}
        for _ = 1, 20 do
          got[#got + 1] = assert(c:receive(4096))
          local v = s:stats()
          assert.is_true(v.buffered <= BUFFER + SIZE + 64, "buffered " .. v.buffered)
        end
        -- then the rest, until the last line has come
        c:settimeout(30)
        local last = string.format("%010d ", N)
        local tail
        repeat
          local line, err = c:receive("*l")
          assert(line, err)
          got[#got + 1] = line .. "\n"
          tail = line
        until tail:find(last, 1, true)
        c:close()
        local text = table.concat(got)
        assert.matches("^HTTP/1.1 200 OK\r\n", text)
        if mode == "sse" then
          assert.matches("\r\nContent%-Type: text/event%-stream\r\n", text)
        end
        local expect = 1
        for i in text:gmatch("(%d%d%d%d%d%d%d%d%d%d) y") do
          assert.equal(expect, tonumber(i))
          expect = expect + 1
        end
        assert.equal(N + 1, expect)
        local ev = sp.wait_until(function()
          for _, e in ipairs(s:events()) do
            if e.route == "flood" then return e end
          end
        end, 10, "the handler to finish")
        assert.equal(N, ev.done)
        -- 8 MiB went through; the server never held more than its buffer
        assert.is_true(rss1 - rss0 < 4096, string.format("RSS grew %d kB while the client stalled", rss1 - rss0))
      end)
    end
  end)

  describe("an idle keep-alive connection", function()
    it("is closed once idle_timeout passes without a request", function()
      local s = sp.start{ idle_timeout = 0.3 }
      finally(function() s:stop() end)
      local c = s:connect()
      assert(c:send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"))
      local r = assert(sp.read_response(c))
      assert.equal(200, r.status)
      assert.is_nil(r.headers.connection)    -- kept alive
      local t0 = socket.gettime()
      local closed, partial = sp.read_until_closed(c, 10)
      local took = socket.gettime() - t0
      c:close()
      local st = s:stats()
      assert.is_true(closed)
      assert.equal("", partial)
      assert.is_true(took >= 0.2, "closed before the idle timeout: " .. took)
      assert.equal(0, st.idle)
    end)
  end)

  describe("SIGTERM", function()
    it("lets the request in flight finish, refuses new connections, and exits", function()
      local s = sp.start{ grace = 20 }
      finally(function() s:stop() end)
      local idle = s:connect()        -- a keep-alive connection with no request
      assert(idle:send("GET /hello HTTP/1.1\r\nHost: x\r\n\r\n"))
      assert.equal(200, assert(sp.read_response(idle)).status)
      local busy = s:connect(20)
      assert(busy:send("GET /hold/drain HTTP/1.1\r\nHost: x\r\n\r\n"))
      sp.wait_until(function()
        for _, e in ipairs(s:events()) do
          if e.route == "hold" then return true end
        end
      end, 10, "the held request to reach its handler")
      s:signal("TERM")
      -- new connections are refused once the listener has closed
      sp.wait_until(function()
        local c = socket.tcp()
        c:settimeout(1)
        local ok, err = c:connect(s.host, s.port)
        c:close()
        return not ok and err == "connection refused"
      end, 10, "the listener to close")
      -- the idle keep-alive connection is closed, without an answer
      local closed, partial = sp.read_until_closed(idle, 10)
      assert.is_true(closed)
      assert.equal("", partial)
      idle:close()
      assert.is_true(s:alive(), "the server exited with a request in flight")
      -- the held request finishes and is answered (and its connection closes)
      s:signal("USR1")
      local r = assert(sp.read_response(busy))
      assert.equal(200, r.status)
      assert.same({ opened = true }, cjson.decode(r.body))
      assert.equal("close", r.headers.connection)
      assert.is_true(sp.read_until_closed(busy, 10))
      busy:close()
      local code, rest = s:wait_exit()
      assert.equal(0, code)
      assert.equal("closed\n", rest)
    end)
  end)
end)
