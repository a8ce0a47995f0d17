-- browser.lua — a headless Chromium (Debian's `chromium`) driven over the
-- DevTools Protocol (cdp.lua), for specs of the web page.
--
--   local browser = require "browser"
--   local b = browser.start{ width = 1280, height = 800 }   -- raises when chromium is missing
--   b:open("http://127.0.0.1:PORT/")     -- navigates and waits for the load event
--   b:eval("document.title")             -- the value (JSON-able), awaiting a promise
--   b:wait_for("document.querySelector('.done') !== null", 10, "the answer")
--   b:click("#send")  b:type("#message", "종이")  b:press_enter()
--   b:fonts(selector)                    -- the fonts that rendered its text
--   b:screenshot(path)                   -- a PNG of the viewport
--   b:stop()
local cjson = require "cjson"
local socket = require "socket"
local mime = require "mime"
local cdp = require "cdp"
local cli = require "cli"
local tmp = require "tmp"

local _M = {}
local B = {}
B.__index = B

local quote = cli.quote

local function slurp(path)
  local f = io.open(path, "rb")
  if not f then return nil end
  local s = f:read("a")
  f:close()
  return s
end

local function wait_until(fn, timeout, what)
  local deadline = socket.gettime() + (timeout or 10)
  while true do
    local v = fn()
    if v then return v end
    if socket.gettime() > deadline then error("timed out waiting for " .. (what or "a condition"), 3) end
    socket.sleep(0.02)
  end
end

-- The chromium executable, or nil.
function _M.executable()
  for _, name in ipairs { os.getenv("CHROMIUM") or "", "chromium", "chromium-browser" } do
    if name ~= "" then
      local p = io.popen("command -v " .. quote(name) .. " 2>/dev/null")
      local path = p:read("l")
      p:close()
      if path and path ~= "" then return path end
    end
  end
  return nil
end

local function http_get(port, path)
  local c = assert(socket.tcp())
  c:settimeout(5)
  assert(c:connect("127.0.0.1", port))
  assert(c:send("GET " .. path .. " HTTP/1.1\r\nHost: 127.0.0.1:" .. port .. "\r\nConnection: close\r\n\r\n"))
  local n = 0
  while true do
    local l = assert(c:receive("*l"))
    if l == "" then break end
    n = tonumber(l:lower():match("^content%-length:%s*(%d+)")) or n
  end
  local body = assert(c:receive(n))
  c:close()
  return body
end

-- start{width, height} -> browser
function _M.start(opts)
  opts = opts or {}
  local exe = _M.executable()
  assert(exe, "chromium is not installed: run make test (tools/install-deps installs it)")
  local dir = tmp.dir("chromium", "file")
  local profile = dir .. "/profile"
  local errfile = dir .. "/stderr"
  local w, h = opts.width or 1280, opts.height or 800
  local args = {
    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
    "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
    "--disable-component-update", "--disable-sync", "--mute-audio", "--hide-scrollbars",
    "--remote-debugging-port=0", "--remote-debugging-address=127.0.0.1",
    "--user-data-dir=" .. profile, string.format("--window-size=%d,%d", w, h), "about:blank",
  }
  for i, a in ipairs(args) do args[i] = quote(a) end
  local cmd = string.format("sh -c %s 2>%s",
    -- (make asan preloads the sanitizers for our code, not for chromium)
    quote("echo $$; exec env -u LD_PRELOAD -u ASAN_OPTIONS -u UBSAN_OPTIONS " .. quote(exe) .. " " ..
      table.concat(args, " ") .. " >/dev/null"), quote(errfile))
  local fh = assert(io.popen(cmd, "r"))
  local pid = tonumber(fh:read("l"))
  local self = setmetatable({ pid = pid, fh = fh, dir = dir, errfile = errfile, width = w, height = h }, B)
  local ok, err = pcall(function()
    -- chromium writes its DevTools port to the profile once it listens
    local port = wait_until(function()
      local s = slurp(profile .. "/DevToolsActivePort")
      return s and tonumber(s:match("^(%d+)\n"))
    end, 30, "chromium's DevTools port (stderr: " .. errfile .. ")")
    self.port = port
    local ws = wait_until(function()
      local ok2, body = pcall(http_get, port, "/json/list")
      if not ok2 or not body then return nil end
      for _, t in ipairs(cjson.decode(body)) do
        if t.type == "page" and t.webSocketDebuggerUrl then return t.webSocketDebuggerUrl end
      end
    end, 10, "chromium's page target")
    self.cdp = cdp.connect(ws, 20)
    self.cdp:call("Page.enable")
    self.cdp:call("Runtime.enable")
    self.cdp:call("Emulation.setDeviceMetricsOverride",
      { width = w, height = h, deviceScaleFactor = 1, mobile = false })
  end)
  if not ok then
    self:stop()
    error(tostring(err) .. "\n" .. (slurp(errfile) or ""), 2)
  end
  return self
end

function B:open(url)
  local r = self.cdp:call("Page.navigate", { url = url })
  if r.errorText then error("cannot open " .. url .. ": " .. r.errorText, 2) end
  self.cdp:wait_event("Page.loadEventFired", 20)
end

-- eval(js) -> its value (a promise is awaited); raises with the page's exception
function B:eval(js)
  local r = self.cdp:call("Runtime.evaluate",
    { expression = js, awaitPromise = true, returnByValue = true, userGesture = true })
  if r.exceptionDetails then
    local ex = r.exceptionDetails.exception
    error("the page threw: " .. tostring(ex and ex.description or r.exceptionDetails.text) .. "\nin: " .. js, 2)
  end
  local v = r.result.value
  if v == cjson.null then return nil end
  return v
end

-- wait_for(js, timeout, what) -> js's first truthy value
function B:wait_for(js, timeout, what)
  return wait_until(function()
    local v = self:eval(js)
    if v == false or v == 0 or v == "" then return nil end
    return v
  end, timeout, what or js)
end

function B:focus(selector)
  self:eval("(() => { const e = document.querySelector(" .. cjson.encode(selector) ..
    "); if (!e) throw new Error('no element ' + " .. cjson.encode(selector) .. "); e.focus(); })()")
end

-- Types text into the element as an input method commits it (Korean included).
function B:type(selector, text)
  self:focus(selector)
  self.cdp:call("Input.insertText", { text = text })
end

function B:press_enter()
  local key = { key = "Enter", code = "Enter", windowsVirtualKeyCode = 13, nativeVirtualKeyCode = 13 }
  key.type, key.text = "keyDown", "\r"
  self.cdp:call("Input.dispatchKeyEvent", key)
  key.type, key.text = "keyUp", nil
  self.cdp:call("Input.dispatchKeyEvent", key)
end

function B:click(selector)
  self:eval("(() => { const e = document.querySelector(" .. cjson.encode(selector) ..
    "); if (!e) throw new Error('no element ' + " .. cjson.encode(selector) .. "); e.click(); })()")
end

-- fonts(selector) -> { {familyName=, glyphCount=}, ... }: the fonts that
-- rendered the element's text (Chromium's own account, tofu included)
function B:fonts(selector)
  self.cdp:call("DOM.enable")
  self.cdp:call("CSS.enable")
  local doc = self.cdp:call("DOM.getDocument", { depth = 0 })
  local q = self.cdp:call("DOM.querySelector", { nodeId = doc.root.nodeId, selector = selector })
  if not q.nodeId or q.nodeId == 0 then error("no element " .. selector, 2) end
  return self.cdp:call("CSS.getPlatformFontsForNode", { nodeId = q.nodeId }).fonts
end

function B:screenshot(path)
  local r = self.cdp:call("Page.captureScreenshot", { format = "png" }, 30)
  local f = assert(io.open(path, "wb"))
  f:write((mime.unb64(r.data)))
  f:close()
end

function B:stop()
  if self.cdp then
    pcall(self.cdp.call, self.cdp, "Browser.close", nil, 5)
    self.cdp:close()
    self.cdp = nil
  end
  if self.fh then
    os.execute("kill " .. self.pid .. " 2>/dev/null")
    self.fh:close()
    self.fh = nil
  end
end

return _M
