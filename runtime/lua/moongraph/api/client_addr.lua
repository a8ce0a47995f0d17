--[[
moongraph.api.client_addr — which address a request comes from, for the
limits that count per client: the connection's peer, or — when the peer
is a proxy the operator trusts — the address that proxy says it forwarded
(the rightmost entry of X-Forwarded-For that is not itself a trusted
proxy). Entries a client wrote itself sit left of what the proxies added,
so they are never taken while a trusted proxy is in front.

  local client_addr = require "moongraph.api.client_addr"
  local trusted, err = client_addr.parse_list("10.0.0.0/8,::1")   -- addresses or CIDR blocks
  client_addr.of(req, trusted)   -> "203.0.113.7" (req.remote_addr, req.headers)
  client_addr.match(trusted, "10.1.2.3") -> true
]]

local type, tonumber, ipairs = type, tonumber, ipairs
local string_find = string.find

local _M = {}

-- "1.2.3.4" -> {bytes...} (4) | "2001:db8::1" -> {bytes...} (16) | nil
local function v4(s)
  local a, b, c, d = s:match("^(%d+)%.(%d+)%.(%d+)%.(%d+)$")
  if not a then return nil end
  local out = { tonumber(a), tonumber(b), tonumber(c), tonumber(d) }
  for i = 1, 4 do if out[i] > 255 then return nil end end
  return out
end

local function v6(s)
  if not string_find(s, ":", 1, true) or string_find(s, "[^%x:%.]") then return nil end
  local head, tail = s, nil
  local dc = string_find(s, "::", 1, true)
  if dc then head, tail = s:sub(1, dc - 1), s:sub(dc + 2) end
  local function groups(part)
    local out = {}
    if part == "" then return out end
    for g in (part .. ":"):gmatch("([^:]*):") do out[#out + 1] = g end
    return out
  end
  local h, t = groups(head), tail and groups(tail) or {}
  local words = {}
  local function add(list)
    for i, g in ipairs(list) do
      local four = i == #list and v4(g)
      if four then
        words[#words + 1] = four[1] * 256 + four[2]
        words[#words + 1] = four[3] * 256 + four[4]
      else
        if not g:find("^%x%x?%x?%x?$") then return false end
        words[#words + 1] = tonumber(g, 16)
      end
    end
    return true
  end
  if not add(h) then return nil end
  local nh = #words
  if tail then
    local tw = {}
    local save = words
    words = tw
    if not add(t) then return nil end
    words = save
    if nh + #tw > 7 then return nil end
    for _ = 1, 8 - nh - #tw do words[#words + 1] = 0 end
    for _, w in ipairs(tw) do words[#words + 1] = w end
  end
  if #words ~= 8 then return nil end
  local out = {}
  for i = 1, 8 do
    out[2 * i - 1] = words[i] >> 8
    out[2 * i] = words[i] & 0xff
  end
  return out
end

local function bytes_of(s)
  if type(s) ~= "string" then return nil end
  s = s:gsub("^%[(.*)%]$", "%1"):gsub("%%.*$", "")
  return v4(s) or v6(s)
end

-- parse_list("a,b/n,...") -> list of {bytes, bits} | nil, err
function _M.parse_list(text)
  local out = {}
  for item in text:gmatch("[^,%s]+") do
    local addr, bits = item:match("^(.-)/(%d+)$")
    addr = addr or item
    local b = bytes_of(addr)
    if not b then return nil, "'" .. item .. "' is not an IP address or CIDR block" end
    local n = bits and tonumber(bits) or #b * 8
    if n > #b * 8 then return nil, "'" .. item .. "': the prefix is longer than the address" end
    out[#out + 1] = { bytes = b, bits = n }
  end
  if #out == 0 then return nil, "no addresses in the list" end
  return out
end

function _M.match(list, addr)
  local b = bytes_of(addr)
  if not b or not list then return false end
  for _, net in ipairs(list) do
    local nb = net.bytes
    if #nb == #b then
      local bits, ok = net.bits, true
      for i = 1, #b do
        if bits <= 0 then break end
        local take = bits >= 8 and 8 or bits
        local mask = (0xff << (8 - take)) & 0xff
        if (b[i] & mask) ~= (nb[i] & mask) then ok = false break end
        bits = bits - 8
      end
      if ok then return true end
    end
  end
  return false
end

-- of(req, trusted) -> the client's address ("?" when the connection has none)
function _M.of(req, trusted)
  local peer = req.remote_addr or "?"
  if not trusted or not _M.match(trusted, peer) then return peer end
  local fwd = req.headers["x-forwarded-for"]
  if type(fwd) ~= "string" then return peer end
  local hops = {}
  for h in fwd:gmatch("[^,%s]+") do hops[#hops + 1] = h end
  for i = #hops, 1, -1 do
    if not bytes_of(hops[i]) then return peer end   -- a malformed hop: trust no further
    if not _M.match(trusted, hops[i]) then return hops[i] end
  end
  return hops[1] or peer
end

return _M
