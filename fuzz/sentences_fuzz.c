/*
** sentences_fuzz.c — libFuzzer harness for core.sentences.split
** (runtime/sentences.c) on arbitrary bytes, against the Lua patterns it
** replaces (spec/support/sentences_reference.lua). Run from the repository
** root (the harness loads that file).
**
** The first byte picks the skip list: none, or some of "[", "■", "※" and
** a prefix cut from the input. The rest is the text. The two splits must
** give the same sentences; anything else aborts, and libFuzzer reports
** the input.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_harness.h"

int mg_open_sentences(lua_State *L);

static lua_State *L;

static const char CHECK[] =
  "local split, reference, text, skip = ...\n"
  "local got, want = split(text, skip), reference(text, skip)\n"
  "assert(#got == #want, 'sentence count differs')\n"
  "for i = 1, #want do assert(got[i] == want[i], 'sentence ' .. i .. ' differs') end\n";

static int check_ref = LUA_NOREF, split_ref = LUA_NOREF, reference_ref = LUA_NOREF;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  L = check_harness_state(CHECK, sizeof CHECK - 1, &check_ref);
  if (luaL_dofile(L, "spec/support/sentences_reference.lua") != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
    abort();
  }
  reference_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  mg_open_sentences(L);
  lua_getfield(L, -1, "split");
  split_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_pop(L, 1);
  return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  int pick = data[0];
  const char *text = (const char *)data + 1;
  size_t n = size - 1;

  lua_rawgeti(L, LUA_REGISTRYINDEX, check_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, split_ref);
  lua_rawgeti(L, LUA_REGISTRYINDEX, reference_ref);
  lua_pushlstring(L, text, n);
  if (pick & 1) {
    static const char *const marks[] = {"[", "\xE2\x96\xA0", "\xE2\x80\xBB"};
    lua_Integer k = 0;
    lua_createtable(L, 4, 0);
    for (int i = 0; i < 3; i++) {
      if (pick & (2 << i)) {
        lua_pushstring(L, marks[i]);
        lua_rawseti(L, -2, ++k);
      }
    }
    size_t cut = (size_t)(pick >> 4) % 4;     /* a prefix of the text, "" too */
    lua_pushlstring(L, text, cut < n ? cut : n);
    lua_rawseti(L, -2, ++k);
  } else {
    lua_pushnil(L);
  }
  if (lua_pcall(L, 4, 0, 0) != LUA_OK) {
    fprintf(stderr, "sentences_fuzz: %s\n", lua_tostring(L, -1));
    abort();
  }
  lua_settop(L, 0);
  return 0;
}
