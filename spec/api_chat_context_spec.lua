-- The Chat API's `context` object keeps what earlier versions stored: a
-- conversation file whose messages name user_location at the top (the
-- embedded backend) and chat_messages rows with a user_location column
-- (the distributed one, migrated in place) show it as context.user_location.
local mg = require "moongraph"
local json = require "moongraph.json"
local pg = require "moongraph.pg"
local migrations = require "moongraph.migrations"
local chat_embedded = require "moongraph.api.chat_embedded"
local chat_distributed = require "moongraph.api.chat_distributed"
local wenv = require "worker_env"
local tmp = require "tmp"

describe("the Chat API's context over what earlier versions stored", function()
  it("embedded: a message stored with user_location reads as context.user_location", function()
    local dir = tmp.dir("chatctx")
    assert(os.execute("mkdir -p " .. dir .. "/chat/conversations"))
    local f = assert(io.open(dir .. "/chat/conversations/c-old.json", "w"))
    f:write(json.encode { id = "c-old", title = "old", created_at = "2026-01-01T00:00:00Z", ts = 1,
      updated_at = "2026-01-01T00:00:00Z", messages = { { role = "user", content = "hi", job_id = "j-old",
        created_at = "2026-01-01T00:00:00Z", user_location = "서울특별시 강남구" } } })
    f:close()
    mg.run(function()
      local b = assert(chat_embedded.new { data = dir, scripts = { { name = "chat", path = "scripts/eco/chat.lua" } } })
      local c = assert(b:conversation(nil, "c-old"))
      assert.same({ user_location = "서울특별시 강남구" }, c.messages[1].context)
      assert.is_nil(c.messages[1].user_location)
    end)
  end)

  describe("distributed", function()
    local env
    setup(function() env = wenv.new() end)
    teardown(function() if env then env:destroy() end end)

    it("migration 2 of the scope chat moves each row's user_location into its context", function()
      mg.run(function()
        local db = assert(pg.connect(env.pg_url))
        local first = { chat_distributed.migrations[1] }
        assert(migrations.migrate(db, { { scope = "chat", list = first } }))
        assert(db:query("INSERT INTO chat_conversations (id, user_id, title) VALUES ('c1', 'u', 't')"))
        assert(db:query([[INSERT INTO chat_messages (job_id, conversation_id, content, user_location, script)
          VALUES ('j1', 'c1', 'hi', '서울특별시 강남구', 'chat'), ('j2', 'c1', 'there', NULL, 'chat')]]))
        assert(migrations.migrate(db, { { scope = "chat", list = chat_distributed.migrations } }))
        local rows = assert(db:query("SELECT job_id, context::text AS context FROM chat_messages ORDER BY job_id"))
        assert.same({ user_location = "서울특별시 강남구" }, json.decode(rows[1].context))
        assert.equal(pg.null, rows[2].context)
        db:close()
      end)
    end)
  end)
end)
