-- The Eco² scenario of the pipeline benches (bench/pipeline.lua,
-- pipeline_profile.lua, node_profile.lua): the message and the user's
-- location, the three upstreams (Kakao keyword search, collection points,
-- KMA forecast) answered by the local test server with recorded bodies,
-- and the node config that points at it with the forecast's clock.
--
--   local scenario = require "eco_scenario"
--   local srv = scenario.server(delay_ms)   -- started; nil delay: at once
--   local cfg = scenario.config(srv)        -- a fresh config per run
local testserver = require "testserver"
local fx = require "node_fixtures"

local _M = {
  MESSAGE = "근처 재활용센터랑 폐건전지 수거함 알려줘",
  LOCATION = "서울특별시 강남구",
  FORECAST_TIME = 1718429400,   -- 2024-06-15 14:30 KST, the time of the recorded KMA forecast
}

function _M.server(delay_ms)
  local srv = testserver.start()
  srv:record {
    { path = "/v2/local/search/keyword.json", status = 200, body = fx.raw("kakao_keyword.json"), delay_ms = delay_ms },
    { path = "/v1/collection-points", status = 200, body = fx.raw("collection_points.json"), delay_ms = delay_ms },
    { path = "/getVilageFcst", status = 200, body = fx.raw("kma_vilage_fcst.json"), delay_ms = delay_ms },
  }
  return srv
end

function _M.config(srv)
  local cfg = fx.offline_ctx().config
  for _, s in ipairs({ "kakao", "collection_point", "kma" }) do
    cfg[s] = { base_url = srv.url, api_key = "bench", timeout = 5 }
  end
  local t = _M.FORECAST_TIME
  cfg.clock = function() return t end
  return cfg
end

return _M
