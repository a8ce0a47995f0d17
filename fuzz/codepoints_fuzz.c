/*
** codepoints_fuzz.c — libFuzzer harness for the code-point scans of
** runtime/codepoints.c (core.codepoints), on arbitrary bytes.
**
** The first byte picks the scan, the second how the rest is cut into its
** arguments (an argument may be any bytes: invalid UTF-8, NUL, marks or
** separators that are not characters). Each result is checked against
** what the scan promises:
**
**   token_estimate  an integer from 0 to the text's length;
**   normalize       valid UTF-8, no upper-case ASCII, no space at either
**                   end nor two in a row, no longer than the text; nil
**                   only for text that is not valid UTF-8;
**   fold            valid UTF-8 of the count it returns, none of the
**                   dropped bytes, no upper-case ASCII;
**   word_ngrams     distinct positive integer keys;
**   bigram_hits     per string, hits from 0 to its characters - 1.
**
** A scan may refuse its arguments only with a "bad argument" error. Any
** other outcome aborts, and libFuzzer reports the input.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"

int mg_open_codepoints(lua_State *L);

static lua_State *L;

static const char CHECK[] =
  "local cp, op, text, arg, list, nmin, nmax = ...\n"
  "local function refused(ok, err)\n"
  "  if ok then return false end\n"
  "  assert(tostring(err):find('bad argument', 1, true), err)\n"
  "  return true\n"
  "end\n"
  "local function lowered(s) assert(not s:find('[A-Z]'), 'upper-case ASCII left') end\n"
  "if op == 0 then\n"
  "  local n = cp.token_estimate(text)\n"
  "  assert(math.type(n) == 'integer' and n >= 0 and n <= #text, 'token estimate out of range')\n"
  "elseif op == 1 then\n"
  "  local ok, out = pcall(cp.normalize, text, arg)\n"
  "  if refused(ok, out) then return end\n"
  "  if out == nil then assert(utf8.len(text) == nil, 'valid text refused') return end\n"
  "  assert(utf8.len(out), 'normalize made invalid UTF-8')\n"
  "  assert(#out <= #text, 'normalize grew the text')\n"
  "  assert(not out:find('^ ') and not out:find(' $') and not out:find('  ', 1, true), 'stray spaces')\n"
  "  lowered(out)\n"
  "elseif op == 2 then\n"
  "  local ok, out, n = pcall(cp.fold, text, arg)\n"
  "  if refused(ok, out) then return end\n"
  "  if out == nil then assert(utf8.len(text) == nil, 'valid text refused') return end\n"
  "  assert(utf8.len(out) == n, 'fold miscounted')\n"
  "  for i = 1, #arg do assert(not out:find(arg:sub(i, i), 1, true), 'a dropped byte is left') end\n"
  "  lowered(out)\n"
  "elseif op == 3 then\n"
  "  local ok, keys = pcall(cp.word_ngrams, text, nmin, nmax, arg)\n"
  "  if refused(ok, keys) then return end\n"
  "  local seen = {}\n"
  "  for _, k in ipairs(keys) do\n"
  "    assert(math.type(k) == 'integer' and k > 0, 'bad key')\n"
  "    assert(not seen[k], 'key listed twice')\n"
  "    seen[k] = true\n"
  "  end\n"
  "else\n"
  "  local ok, hits = pcall(cp.bigram_hits, text, list)\n"
  "  if not ok then assert(tostring(hits):find('invalid UTF-8', 1, true), hits) return end\n"
  "  for i, s in ipairs(list) do\n"
  "    local chars = assert(utf8.len(s))\n"
  "    assert(hits[i] >= 0 and hits[i] <= math.max(0, chars - 1), 'hits out of range')\n"
  "  end\n"
  "end\n";

static int check_ref = LUA_NOREF;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = check_harness_state(CHECK, sizeof CHECK - 1, &check_ref);
  luaL_requiref(L, "codepoints", mg_open_codepoints, 0);
  lua_setglobal(L, "CP");
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  int op = data[0] % 5;
  size_t cut = data[1];
  const char *rest = (const char *)data + 2;
  size_t n = size - 2;
  size_t argn = (cut % 9) < n ? (cut % 9) : n;    /* marks, drop set or separators */

  lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
  lua_getglobal(L, "CP");
  lua_pushinteger(L, op);
  if (op == 4) {
    /* the text, then strings of (cut % 7) + 1 bytes */
    size_t half = n / 2, step = cut % 7 + 1;
    lua_pushlstring(L, rest, half);
    lua_pushliteral(L, "");
    lua_createtable(L, 0, 0);
    for (size_t i = half, k = 1; i < n; i += step, k++) {
      lua_pushlstring(L, rest + i, i + step <= n ? step : n - i);
      lua_rawseti(L, -2, (lua_Integer)k);
    }
  } else {
    lua_pushlstring(L, rest + argn, n - argn);
    lua_pushlstring(L, rest, argn);
    lua_pushnil(L);
  }
  lua_pushinteger(L, (lua_Integer)(cut >> 4) % 5);        /* nmin: 0..4, some refused */
  lua_pushinteger(L, (lua_Integer)(cut >> 2) % 5);        /* nmax */
  if (lua_pcall(L, 7, 0, 0) != LUA_OK) {
    fprintf(stderr, "codepoints_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  return 0;
}
