/*
** fields_fuzz.c — libFuzzer harness for the checks every field a client
** sends goes through (runtime/lua/moongraph/api/fields.lua), on arbitrary
** request bodies: decoded by the C JSON decoder as the server decodes them
** (fuzz/json_harness.h), then every value in them put through each check.
** Run from the repository root (the harness loads runtime/lua).
**
** Besides ASan/UBSan, the harness holds each check to its promise:
**
**   1. no check raises, whatever it is given;
**   2. body(raw) gives a value whose every string (keys too) is valid
**      UTF-8 without U+0000 and whose every number is finite, or nil and a
**      message;
**   3. integer(v, name, {min, max}) gives an integer (math.type) within
**      [min, max], or nil and a message that starts with the field's name;
**      number() a finite number within range; page() a limit within its
**      bounds and an offset within [0, MAX_OFFSET], or a message naming
**      limit or offset; string(), boolean(), object(), strings() a value of
**      their kind, or a message naming the field.
**
** Any broken promise aborts, which libFuzzer reports with the input.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "json_harness.h"

static const char *CHECKS =
  "local fields = require 'moongraph.api.fields'\n"
  "local json = require 'moongraph.json'\n"
  "local function fail(what) error('broken promise: ' .. what, 0) end\n"
  "local function clean(v)\n"
  "  local t = type(v)\n"
  "  if t == 'string' then return utf8.len(v) ~= nil and not v:find('\\0', 1, true) end\n"
  "  if t == 'number' then return v == v and v ~= math.huge and v ~= -math.huge end\n"
  "  if t == 'table' then\n"
  "    for k, x in pairs(v) do if not clean(k) or not clean(x) then return false end end\n"
  "  end\n"
  "  return true\n"
  "end\n"
  "local function named(msg, name)\n"
  "  if type(msg) ~= 'string' or msg:sub(1, #name) ~= name then fail(name .. ': ' .. tostring(msg)) end\n"
  "end\n"
  "local function each_value(v, fn, depth)\n"
  "  fn(v)\n"
  "  if type(v) == 'table' and depth < 4 then\n"
  "    for _, x in pairs(v) do each_value(x, fn, depth + 1) end\n"
  "  end\n"
  "end\n"
  "return function(raw)\n"
  "  local v, err = fields.body(raw)\n"
  "  if v == nil then\n"
  "    if type(err) ~= 'string' then fail('body without a message') end\n"
  "    v = json.decode(raw)\n"
  "    if v == nil then return end\n"
  "  elseif not clean(v) then fail('body let through text a store refuses')\n"
  "  end\n"
  "  each_value(v, function(x)\n"
  "    local n, e = fields.integer(x, 'limit', { min = 1, max = 1000 })\n"
  "    if n ~= nil then\n"
  "      if math.type(n) ~= 'integer' or n < 1 or n > 1000 then fail('integer out of range') end\n"
  "    elseif x ~= nil and x ~= json.null then named(e, 'limit') end\n"
  "    local f\n"
  "    f, e = fields.number(x, 'after', { min = 0, max = 86400 })\n"
  "    if f ~= nil then\n"
  "      if type(f) ~= 'number' or f ~= f or f < 0 or f > 86400 then fail('number out of range') end\n"
  "    elseif x ~= nil and x ~= json.null then named(e, 'after') end\n"
  "    local s\n"
  "    s, e = fields.string(x, 'name', { max = 200 })\n"
  "    if s ~= nil then\n"
  "      if type(s) ~= 'string' or #s > 200 or not clean(s) then fail('string') end\n"
  "    elseif x ~= nil and x ~= json.null then named(e, 'name') end\n"
  "    s, e = fields.string(x, 'order', { one_of = { 'asc', 'desc' } })\n"
  "    if s ~= nil then\n"
  "      if s ~= 'asc' and s ~= 'desc' then fail('one_of') end\n"
  "    elseif x ~= nil and x ~= json.null then named(e, 'order') end\n"
  "    local b\n"
  "    b, e = fields.boolean(x, 'wait')\n"
  "    if b ~= nil then\n"
  "      if type(b) ~= 'boolean' then fail('boolean') end\n"
  "    elseif x ~= nil and x ~= json.null then named(e, 'wait') end\n"
  "    local o\n"
  "    o, e = fields.object(x, 'metadata')\n"
  "    if o ~= nil then\n"
  "      if type(o) ~= 'table' or json.is_array(o) then fail('object') end\n"
  "    else named(e, 'metadata') end\n"
  "    local l\n"
  "    l, e = fields.strings(x, 'ids', { max = 50 })\n"
  "    if l ~= nil then\n"
  "      if type(l) ~= 'table' or #l > 50 then fail('strings') end\n"
  "      for i = 1, #l do if type(l[i]) ~= 'string' or not clean(l[i]) then fail('strings item') end end\n"
  "    elseif e ~= nil then named(e, 'ids') end\n"
  "  end, 0)\n"
  "  if type(v) == 'table' then\n"
  "    local p, e = fields.page(v, { limit = 10, max_limit = 1000 })\n"
  "    if p then\n"
  "      if math.type(p.limit) ~= 'integer' or p.limit < 1 or p.limit > 1000 then fail('page limit') end\n"
  "      if math.type(p.offset) ~= 'integer' or p.offset < 0 or p.offset > fields.MAX_OFFSET then\n"
  "        fail('page offset')\n"
  "      end\n"
  "    elseif type(e) ~= 'string' or not (e:find('^limit') or e:find('^offset')) then\n"
  "      fail('page: ' .. tostring(e))\n"
  "    end\n"
  "    local ok, terr = fields.text(v, 'body')\n"
  "    if ok ~= true and (type(terr) ~= 'string' or not terr:find('^body')) then fail('text') end\n"
  "  end\n"
  "end\n";

static lua_State *L;
static int check_ref;

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (!L) {
    L = json_harness_state();
    if (luaL_loadstring(L, CHECKS) != LUA_OK || lua_pcall(L, 0, 1, 0) != LUA_OK) {
      fprintf(stderr, "fields_fuzz: %s\n", lua_tostring(L, -1));
      abort();
    }
    check_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 0, 0) != LUA_OK) {
    fprintf(stderr, "fields_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  return 0;
}
