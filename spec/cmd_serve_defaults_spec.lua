-- What `moongraph serve` serves without --script: the scripts the
-- applications on the module path declare (scripts/APP/serve.lua), read by
-- moongraph.commands.served(); the runtime itself names none.
local cli = require "cli"
local tmp = require "tmp"

local function write(path, text)
  local f = assert(io.open(path, "w"))
  f:write(text)
  f:close()
end

local function served(env)
  local r = cli.run({ "-e", [[
    local list, err = require("moongraph.commands").served()
    print(list and table.concat(list, " ") or ("error: " .. err))]] }, { env = env })
  return (r.out:gsub("\n$", ""))
end

describe("serve's scripts without --script", function()
  it("are those the applications declare: Eco² declares its chat pipeline", function()
    assert.equal("chat=scripts/eco/chat.lua", served())
  end)

  it("come from every application on the path, the first root's first; a name taken is skipped", function()
    local dir = tmp.dir("apps")
    assert(os.execute("mkdir -p " .. dir .. "/scripts/mine"))
    write(dir .. "/scripts/mine/serve.lua", 'return { { name = "agent", path = "a.lua" }, { name = "chat", path = "c.lua" } }')
    assert.equal("agent=a.lua chat=c.lua", served("MOONGRAPH_PATH=" .. dir))
  end)

  it("a declaration that is not a list of {name, path} is named as the error", function()
    local dir = tmp.dir("apps")
    assert(os.execute("mkdir -p " .. dir .. "/scripts/bad"))
    write(dir .. "/scripts/bad/serve.lua", 'return { "chat.lua" }')
    assert.equal("error: scripts/bad/serve.lua: entry 1 must be {name = NAME, path = PATH}",
      served("MOONGRAPH_PATH=" .. dir))
  end)

  it("with no application on the path, serve asks for --script", function()
    -- a copy of the binary in a directory without scripts/
    local bin = cli.bin:sub(1, 1) == "/" and cli.bin or (os.getenv("PWD") .. "/" .. cli.bin)
    local lone = tmp.dir("lone")
    assert(os.execute("cp " .. cli.quote(bin) .. " " .. cli.quote(lone)))
    local p = io.popen("cd " .. cli.quote(lone) .. " && MOONGRAPH_PATH= ./" .. bin:match("([^/]+)$") ..
      " serve --port 0 2>&1; echo \"exit=$?\"")
    local out = p:read("a")
    p:close()
    assert.matches("no script to serve: give --script [NAME=]PATH", out, 1, true)
    assert.matches("exit=2", out)
  end)
end)
