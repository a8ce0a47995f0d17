/*
** json_decode_fuzz.c — libFuzzer harness for the C JSON decoder
** (runtime/json.c) against the Lua decoder it replaces
** (runtime/lua/moongraph/json.lua), on arbitrary bytes.
**
**   - when the Lua decoder reads a value, C must read the same one: the
**     same types down to integer and float, the same keys, the array marker
**     on the same (empty) tables;
**   - when the Lua decoder refuses the text, C must refuse it with the same
**     message and byte position.
**
** The one difference allowed: a \u escape without four hex digits right
** after it, which the Lua decoder reads with tonumber (" 1a2" passes, "-001"
** raises) and C refuses; there C only has to return. Any other difference
** aborts. Run from the repository root.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "json_harness.h"

static lua_State *L;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc; (void)argv;
  L = json_harness_state();
  if (luaL_dostring(L,
        "local json = require 'moongraph.json'\n"
        "local C = require('moongraph.core').json.decode\n"
        "local NULL, ARR = json.null, getmetatable(json.array())\n"
        "CHECK = function(text)\n"
        "  local got, gerr = C(text, NULL, ARR)\n"
        "  if text:find('\\\\u%x?%x?%x?[^%x]') then return true end\n"
        "  local ok, want, werr = pcall(json.lua_decode, text)\n"
        "  if not ok then return false, 'Lua raised: ' .. tostring(want) end\n"
        "  if want == nil then\n"
        "    return got == nil and gerr == werr, 'refusals differ: ' .. tostring(werr) .. ' vs ' .. tostring(gerr)\n"
        "  end\n"
        "  return SAME(want, got), 'values differ'\n"
        "end\n") != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
    abort();
  }
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  int top = lua_gettop(L);
  lua_getglobal(L, "CHECK");
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 1, 2, 0) != LUA_OK) {
    fprintf(stderr, "harness: %s\n", lua_tostring(L, -1));
    abort();
  }
  if (!lua_toboolean(L, -2)) {
    fprintf(stderr, "%s on: %.*s\n", lua_tostring(L, -1), (int)size, (const char *)data);
    abort();
  }
  lua_settop(L, top);
  lua_gc(L, LUA_GCSTEP, 0);
  return 0;
}
