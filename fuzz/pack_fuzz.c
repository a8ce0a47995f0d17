/*
** pack_fuzz.c — libFuzzer harness for core.pack's reader
** (runtime/pack.c unpack) on arbitrary bytes.
**
** unpack must either refuse the bytes with its one error ("not a packed
** value") or give values; given values must pack again (or be refused by
** pack only for what JSON cannot hold: NaN and the infinities), and that
** packed form must unpack to values equal, table by table, to the first
** ones. Any other outcome aborts, and libFuzzer reports the input.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>

#include "check_harness.h"

int mg_open_pack(lua_State *L);

static lua_State *L;
static int check_ref = LUA_NOREF;

static const char CHECK[] =
  "local P, s = ...\n"
  "local null, array_mt = {}, {}\n"
  "local got = table.pack(pcall(P.unpack, s, null, array_mt))\n"
  "if not got[1] then\n"
  "  assert(tostring(got[2]):find('not a packed value', 1, true), got[2])\n"
  "  return\n"
  "end\n"
  "local function unjsonable(v)\n"
  "  if type(v) == 'number' then return v ~= v or v == math.huge or v == -math.huge end\n"
  "  if type(v) ~= 'table' then return false end\n"
  "  for k, x in pairs(v) do if unjsonable(x) then return true end end\n"
  "  return false\n"
  "end\n"
  "local function same(a, b)\n"
  "  if a == b then return true end\n"
  "  if type(a) ~= type(b) then return false end\n"
  "  if type(a) == 'number' then return math.type(a) == math.type(b) and a ~= a and b ~= b end\n"
  "  if type(a) ~= 'table' then return false end\n"
  "  if (getmetatable(a) == array_mt) ~= (getmetatable(b) == array_mt) then return false end\n"
  "  for k, x in pairs(a) do if not same(x, b[k]) then return false end end\n"
  "  for k in pairs(b) do if a[k] == nil then return false end end\n"
  "  return true\n"
  "end\n"
  "local values = table.move(got, 2, got.n, 1, {})\n"
  "local n = got.n - 1\n"
  "local again = P.pack(null, array_mt, table.unpack(values, 1, n))\n"
  "if again == nil then\n"
  "  for i = 1, n do if unjsonable(values[i]) then return end end\n"
  "  error('pack refused what unpack gave')\n"
  "end\n"
  "local back = table.pack(P.unpack(again, null, array_mt))\n"
  "assert(back.n == n, 'a different number of values')\n"
  "for i = 1, n do assert(same(values[i], back[i]), 'a value changed in a round trip') end\n";

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = check_harness_state(CHECK, sizeof CHECK - 1, &check_ref);
  luaL_requiref(L, "pack", mg_open_pack, 0);
  lua_setglobal(L, "PACK");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
  lua_getglobal(L, "PACK");
  lua_pushlstring(L, (const char *)data, size);
  if (lua_pcall(L, 2, 0, 0) != LUA_OK) {
    fprintf(stderr, "pack_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  return 0;
}
