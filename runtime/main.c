/*
** main.c — the `moongraph` executable.
**
** Sets up a Lua state with the runtime built in: moongraph.core is
** preloaded, the Lua half of the runtime is served from the copy embedded
** at build time (after package.path, so MOONGRAPH_PATH and package.path win
** during development), and the command line is handed to the Lua module
** moongraph.cli, whose return value is the exit status.
*/
#include "mg.h"

#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

extern const struct { const char *name; const char *src; size_t len; } mg_embedded[];

int mg_open_repl(lua_State *L);

/* package.searchers entry: finds a module among the embedded sources. */
static int search_embedded(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  for (int i = 0; mg_embedded[i].name; i++) {
    if (strcmp(mg_embedded[i].name, name) != 0) continue;
    lua_pushfstring(L, "=[moongraph]/%s", name);
    const char *chunkname = lua_tostring(L, -1);
    if (luaL_loadbuffer(L, mg_embedded[i].src, mg_embedded[i].len, chunkname))
      return lua_error(L);
    lua_pushfstring(L, "[moongraph]/%s", name);
    return 2;
  }
  lua_pushfstring(L, "no embedded module '%s'", name);
  return 1;
}

/* Insert the embedded searcher right after the Lua-file searcher, and put
** MOONGRAPH_PATH (a ;-separated list of directories) in front of package.path. */
static void setup_package(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_moongraph_core);
  lua_setfield(L, -2, "moongraph.core");
  lua_pushcfunction(L, mg_open_repl);
  lua_setfield(L, -2, "moongraph.repl_core");
  lua_pop(L, 1);

  lua_getfield(L, -1, "searchers");
  lua_Integer n = luaL_len(L, -1);
  for (lua_Integer i = n; i >= 3; i--) {
    lua_rawgeti(L, -1, i);
    lua_rawseti(L, -2, i + 1);
  }
  lua_pushcfunction(L, search_embedded);
  lua_rawseti(L, -2, 3);
  lua_pop(L, 1);

  const char *extra = getenv("MOONGRAPH_PATH");
  if (extra && *extra) {
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    const char *p = extra;
    while (*p) {
      const char *e = strchr(p, ';');
      size_t len = e ? (size_t)(e - p) : strlen(p);
      if (len) {
        luaL_addlstring(&b, p, len); luaL_addstring(&b, "/?.lua;");
        luaL_addlstring(&b, p, len); luaL_addstring(&b, "/?/init.lua;");
      }
      p += len + (e ? 1 : 0);
    }
    lua_getfield(L, -2, "path");
    luaL_addvalue(&b);
    luaL_pushresult(&b);
    lua_setfield(L, -2, "path");
  }
  lua_pop(L, 1);
}

static int msghandler(lua_State *L) {
  const char *msg = lua_tostring(L, 1);
  if (!msg) msg = lua_pushfstring(L, "(error object is a %s value)", luaL_typename(L, 1));
  luaL_traceback(L, L, msg, 1);
  return 1;
}

static int pmain(lua_State *L) {
  int argc = (int)lua_tointeger(L, 1);
  char **argv = (char **)lua_touserdata(L, 2);
  luaL_openlibs(L);
  setup_package(L);
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moongraph.cli");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "main");
  lua_createtable(L, argc, 0);
  for (int i = 0; i < argc; i++) {
    lua_pushstring(L, argv[i]);
    lua_rawseti(L, -2, i);
  }
  lua_call(L, 1, 1);
  return 1;
}

int main(int argc, char **argv) {
  lua_State *L = luaL_newstate();
  if (!L) { fputs("moongraph: cannot create Lua state\n", stderr); return 1; }
  lua_pushcfunction(L, msghandler);
  lua_pushcfunction(L, pmain);
  lua_pushinteger(L, argc);
  lua_pushlightuserdata(L, argv);
  int status = lua_pcall(L, 2, 1, 1);
  int code;
  if (status != LUA_OK) {
    fprintf(stderr, "moongraph: %s\n", lua_tostring(L, -1));
    code = 1;
  } else {
    code = lua_isinteger(L, -1) ? (int)lua_tointeger(L, -1) : 0;
  }
  fflush(stdout);
  lua_close(L);
  return code;
}
