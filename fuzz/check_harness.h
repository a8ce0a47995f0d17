/*
** check_harness.h — the Lua state of the fuzz harnesses that hold a C
** module to a check written in Lua: the standard libraries, and the check
** chunk compiled once and kept in the registry.
*/
#ifndef CHECK_HARNESS_H
#define CHECK_HARNESS_H

#include <stdio.h>
#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

/* A new state with `check` (len bytes of Lua) compiled: its registry
** reference in *check_ref. Aborts when the chunk does not compile. */
static lua_State *check_harness_state(const char *check, size_t len, int *check_ref) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_loadbuffer(L, check, len, "=check") != LUA_OK) {
    fprintf(stderr, "%s\n", lua_tostring(L, -1));
    abort();
  }
  *check_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return L;
}

#endif
