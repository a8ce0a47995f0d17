/*
** repl.c — line editing for the REPL (libedit).
**
** Exposes `moongraph.repl_core` with readline(prompt) -> line | nil (EOF),
** add_history(line), load_history(path), save_history(path) and
** isatty(fd). The REPL itself (multi-line input, evaluation in a task,
** pretty-printing) is Lua: runtime/lua/moongraph/repl.lua.
*/
#include "mg.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <editline/readline.h>

static int l_readline(lua_State *L) {
  const char *prompt = luaL_optstring(L, 1, "> ");
  if (!isatty(STDIN_FILENO)) {
    /* piped input: plain line reads, no echo of the prompt */
    luaL_Buffer b;
    luaL_buffinit(L, &b);
    int c, any = 0;
    while ((c = getchar()) != EOF && c != '\n') { luaL_addchar(&b, (char)c); any = 1; }
    if (c == EOF && !any) { lua_pushnil(L); return 1; }
    luaL_pushresult(&b);
    return 1;
  }
  char *line = readline(prompt);
  if (!line) { lua_pushnil(L); return 1; }
  lua_pushstring(L, line);
  free(line);
  return 1;
}

static int l_add_history(lua_State *L) {
  const char *line = luaL_checkstring(L, 1);
  if (isatty(STDIN_FILENO)) add_history(line);
  return 0;
}

static int l_load_history(lua_State *L) {
  read_history(luaL_checkstring(L, 1));
  return 0;
}

static int l_save_history(lua_State *L) {
  const char *path = luaL_checkstring(L, 1);
  if (isatty(STDIN_FILENO)) {
    stifle_history(1000);
    write_history(path);
  }
  return 0;
}

static int l_isatty(lua_State *L) {
  lua_pushboolean(L, isatty((int)luaL_optinteger(L, 1, STDIN_FILENO)));
  return 1;
}

static const luaL_Reg repl_funcs[] = {
  {"readline", l_readline},
  {"add_history", l_add_history},
  {"load_history", l_load_history},
  {"save_history", l_save_history},
  {"isatty", l_isatty},
  {NULL, NULL}
};

int mg_open_repl(lua_State *L) {
  luaL_newlib(L, repl_funcs);
  return 1;
}
