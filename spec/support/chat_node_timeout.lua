-- Run by spec/cmd_chat_spec.lua through `moongraph run`: the pipeline built
-- with node_timeouts, its weather node (the real one, with a 0.2 s node
-- timeout) waiting on a test-server endpoint that answers after 3 s. Prints
-- one JSON line: the weather error, whether the turn was answered, the answer.
package.path = "spec/support/?.lua;" .. package.path
local mg = require "moongraph"
local cjson = require "cjson"
local testserver = require "testserver"
local chat = require "scripts.eco.chat"

local srv = testserver.start()
srv:record { path = "/getVilageFcst", status = 200, body = "{}", delay_ms = 3000 }
chat.timeout_grace = 0
local weather = setmetatable({ timeout = 0.2 }, { __index = require "nodes.weather" })
local app = chat.build { node_timeouts = true, nodes = { weather = weather } }
local state, err = app:invoke(chat.input("종이 어떻게 버려?", { location = "서울특별시 강남구" }),
  chat.config { kma = { base_url = srv.url, api_key = "k" } })
srv:stop()
local out = { answered = state ~= nil, error = err }
if state then
  out.answer = state.answer
  out.weather_error = state.contexts.weather and state.contexts.weather.error
end
print(cjson.encode(out))
