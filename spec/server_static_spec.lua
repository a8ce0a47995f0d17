-- moongraph.server's static files, against a server in its own process
-- (spec/support/server_app.lua): content types, ETag and Last-Modified with
-- 304, index files, HEAD, and the paths that must never leave the static
-- directory: "..", percent-encoded "..", dot files and symlinks that point
-- outside. Raw sockets send the paths as written (curl would normalise
-- "..").
local sp = require "serverproc"
local tmp = require "tmp"

local function write(path, text)
  local f = assert(io.open(path, "wb"))
  assert(f:write(text))
  assert(f:close())
end

local function sh(cmd)
  assert(os.execute(cmd), cmd)
end

local function get(s, target, extra)
  local c = s:connect()
  assert(c:send("GET " .. target .. " HTTP/1.1\r\nHost: x\r\n" .. (extra or "") .. "\r\n"))
  local r = assert(sp.read_response(c))
  c:close()
  return r
end

describe("moongraph.server static files", function()
  local s, base, root
  local SECRET = "the secret outside the root"

  setup(function()
    base = tmp.dir("static", "file")
    root = base .. "/web"
    sh("mkdir -p " .. root .. "/sub " .. base .. "/outside")
    write(root .. "/index.html", "<h1>home</h1>")
    write(root .. "/app.js", "console.log(1)")
    write(root .. "/style.css", "body{}")
    write(root .. "/data.json", '{"a":1}')
    write(root .. "/logo.svg", "<svg/>")
    write(root .. "/notes.txt", "plain notes")
    write(root .. "/blob.bin", "\0\1\2")
    write(root .. "/sub/index.html", "<h1>sub</h1>")
    write(root .. "/.env", "API_KEY=" .. SECRET)
    write(base .. "/outside/secret.txt", SECRET)
    write(root .. "/big.txt", string.rep("0123456789abcdef", 4 * 65536))   -- 4 MiB
    sh("ln -s notes.txt " .. root .. "/inside-link")
    sh("ln -s ../outside/secret.txt " .. root .. "/escape")
    sh("ln -s ../outside " .. root .. "/escape-dir")
    sh("ln -s " .. base .. "/outside/secret.txt " .. root .. "/absolute")
    s = sp.start{ static = root, stream_buffer = 16384 }
  end)
  teardown(function()
    s:stop()
  end)

  it("serves files with a content type for their extension", function()
    local want = {
      ["/index.html"] = "text/html; charset=utf-8",
      ["/app.js"] = "text/javascript; charset=utf-8",
      ["/style.css"] = "text/css; charset=utf-8",
      ["/data.json"] = "application/json",
      ["/logo.svg"] = "image/svg+xml",
      ["/notes.txt"] = "text/plain; charset=utf-8",
      ["/blob.bin"] = "application/octet-stream",
    }
    local bodies = {}
    for path, ctype in pairs(want) do
      local r = s:curl{ path }
      assert.equal(200, r.status, path)
      assert.equal(ctype, r.headers["content-type"], path)
      bodies[path] = r.body
    end
    assert.equal('{"a":1}', bodies["/data.json"])
    assert.equal("\0\1\2", bodies["/blob.bin"])
  end)

  it("serves index.html for a directory and redirects a directory without its slash", function()
    local home = s:curl{ "/" }
    assert.equal(200, home.status)
    assert.equal("<h1>home</h1>", home.body)
    local sub = get(s, "/sub?x=1")
    assert.equal(301, sub.status)
    assert.equal("/sub/?x=1", sub.headers.location)
    local idx = s:curl{ "/sub/" }
    assert.equal("<h1>sub</h1>", idx.body)
  end)

  it("sends an ETag and Last-Modified, and 304 when either says the copy is current", function()
    local r = s:curl{ "/notes.txt" }
    local etag, modified = r.headers.etag, r.headers["last-modified"]
    assert.matches('^"[%x]+%-[%x]+"$', etag)
    assert.matches("^%a%a%a, %d%d %a%a%a %d%d%d%d %d%d:%d%d:%d%d GMT$", modified)
    local by_tag = get(s, "/notes.txt", "If-None-Match: " .. etag .. "\r\n")
    assert.equal(304, by_tag.status)
    assert.equal("", by_tag.body)
    assert.equal(etag, by_tag.headers.etag)
    local weak = get(s, "/notes.txt", 'If-None-Match: "other", W/' .. etag .. "\r\n")
    assert.equal(304, weak.status)
    local by_date = get(s, "/notes.txt", "If-Modified-Since: " .. modified .. "\r\n")
    assert.equal(304, by_date.status)
    local stale = get(s, "/notes.txt", 'If-None-Match: "0-0"\r\n')
    assert.equal(200, stale.status)
    assert.equal("plain notes", stale.body)
    local old = get(s, "/notes.txt", "If-Modified-Since: Sun, 06 Nov 1994 08:49:37 GMT\r\n")
    assert.equal(200, old.status)
  end)

  it("answers HEAD with the file's headers and no body", function()
    local c = s:connect()
    assert(c:send("HEAD /app.js HTTP/1.1\r\nHost: x\r\n\r\nGET /notes.txt HTTP/1.1\r\nHost: x\r\n\r\n"))
    local h = assert(sp.read_response(c, true))
    assert.equal(200, h.status)
    assert.equal(tostring(#"console.log(1)"), h.headers["content-length"])
    -- the next response follows the head at once: no body was sent
    local r = assert(sp.read_response(c))
    assert.equal("plain notes", r.body)
    c:close()
  end)

  it("sends a file larger than the stream buffer whole", function()
    local r = s:curl{ "/big.txt" }
    assert.equal(200, r.status)
    assert.equal(4 * 1024 * 1024, #r.body)
    assert.is_true(r.body == string.rep("0123456789abcdef", 4 * 65536))
  end)

  it("never serves a path with '..' segments, however they are written", function()
    for _, target in ipairs{
      "/../outside/secret.txt",
      "/sub/../../outside/secret.txt",
      "/%2e%2e/outside/secret.txt",
      "/%2E%2E/outside/secret.txt",
      "/sub/%2e%2e/%2e%2e/outside/secret.txt",
      "/..%2foutside%2fsecret.txt",
      "/sub/..%2F..%2Foutside%2Fsecret.txt",
      "/.%2e/outside/secret.txt",
      "/%252e%252e/outside/secret.txt",
      "http://x/../outside/secret.txt",
    } do
      local r = get(s, target)
      assert.is_true(r.status == 404 or r.status == 400, target .. " gave " .. r.status)
      assert.is_nil(r.body:find(SECRET, 1, true), target)
    end
  end)

  it("answers 400 for a NUL or a broken escape in the path", function()
    assert.equal(400, get(s, "/notes.txt%00.html").status)
    assert.equal(400, get(s, "/notes%2").status)
  end)

  it("never serves dot files", function()
    for _, target in ipairs{ "/.env", "/%2eenv", "/sub/../.env" } do
      local r = get(s, target)
      assert.equal(404, r.status, target)
      assert.is_nil(r.body:find(SECRET, 1, true), target)
    end
  end)

  it("follows a symlink that stays inside the directory", function()
    local r = s:curl{ "/inside-link" }
    assert.equal(200, r.status)
    assert.equal("plain notes", r.body)
  end)

  it("never follows a symlink out of the directory", function()
    -- the files are there: only the symlinks' direction keeps them out
    local f = assert(io.open(root .. "/escape"))
    assert.equal(SECRET, f:read("a"))
    f:close()
    for _, target in ipairs{ "/escape", "/escape-dir/secret.txt", "/absolute" } do
      local r = get(s, target)
      assert.equal(404, r.status, target)
      assert.is_nil(r.body:find(SECRET, 1, true), target)
    end
  end)

  it("still answers routes and 404 beside the static files", function()
    assert.equal(200, s:curl{ "/hello" }.status)
    local r = s:curl{ "/no-such-file.txt" }
    assert.equal(404, r.status)
    assert.equal("application/json", r.headers["content-type"])
  end)
end)
