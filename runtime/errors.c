/*
** errors.c — errors as values.
**
** A failure the runtime reports (a client's `nil, err`, a saver's, a
** run's) is a table
**
**   { code = "timeout", message = "...", retryable = true, details = {...} }
**
** made where the fact is known: the Postgres client knows the SQLSTATE,
** the Redis client the error reply's first word, the HTTP client curl's
** code. Callers branch on `code` and `retryable`, never on the wording.
**
** It still reads like the string it used to be: tostring, print, "%s"
** and `..` give the message, `#err` its length, and string methods
** (err:find, err:match, err:sub...) apply to the message, so scripts that
** treated errors as strings keep working.
**
** Codes: a few shared words (invalid, not_found, conflict, timeout,
** unavailable, cancelled, too_large, tls, protocol, failed) and, from a
** server, its own: "pg:40001", "redis:READONLY". docs/runtime.md lists
** them.
*/
#include "mg.h"

#include <string.h>

#define ERROR_MT "moongraph.error"

static int message_of(lua_State *L, int i) {
  i = lua_absindex(L, i);
  if (lua_type(L, i) == LUA_TTABLE && lua_getmetatable(L, i)) {
    luaL_getmetatable(L, ERROR_MT);
    int is = lua_rawequal(L, -1, -2);
    lua_pop(L, 2);
    if (is) {
      lua_getfield(L, i, "message");
      if (lua_type(L, -1) == LUA_TSTRING) return 1;
      lua_pop(L, 1);
      lua_pushliteral(L, "error");
      return 1;
    }
  }
  return 0;
}

static int e_tostring(lua_State *L) {
  if (!message_of(L, 1)) luaL_tolstring(L, 1, NULL);
  return 1;
}

static int e_concat(lua_State *L) {
  for (int i = 1; i <= 2; i++)
    if (!message_of(L, i)) luaL_tolstring(L, i, NULL);
  lua_concat(L, 2);
  return 1;
}

static int e_len(lua_State *L) {
  message_of(L, 1);
  lua_pushinteger(L, (lua_Integer)lua_rawlen(L, -1));
  return 1;
}

/* err:find(...) and the like: the string method on the message */
static int e_string_method(lua_State *L) {
  int n = lua_gettop(L);
  if (n >= 1 && message_of(L, 1)) lua_replace(L, 1);
  lua_pushvalue(L, lua_upvalueindex(1));
  lua_insert(L, 1);
  lua_call(L, n, LUA_MULTRET);
  return lua_gettop(L);
}

static int e_index(lua_State *L) {
  if (lua_type(L, 2) != LUA_TSTRING) return 0;
  lua_pushliteral(L, "");
  if (!luaL_getmetafield(L, -1, "__index")) return 0;   /* the string library */
  lua_pushvalue(L, 2);
  if (lua_rawget(L, -2) != LUA_TFUNCTION) return 0;
  lua_pushcclosure(L, e_string_method, 1);
  return 1;
}

static void push_metatable(lua_State *L) {
  if (luaL_newmetatable(L, ERROR_MT)) {
    static const luaL_Reg mt[] = {
      {"__tostring", e_tostring}, {"__concat", e_concat}, {"__len", e_len},
      {"__index", e_index}, {NULL, NULL}};
    luaL_setfuncs(L, mt, 0);
  }
}

void mg_error_new(lua_State *L, const char *code, int retryable) {
  int msg = lua_gettop(L);
  lua_createtable(L, 0, 4);
  lua_pushstring(L, code);
  lua_setfield(L, -2, "code");
  lua_pushvalue(L, msg);
  lua_setfield(L, -2, "message");
  lua_pushboolean(L, retryable);
  lua_setfield(L, -2, "retryable");
  push_metatable(L);
  lua_setmetatable(L, -2);
  lua_replace(L, msg);
}

void mg_error_detail(lua_State *L, const char *key) {
  if (lua_getfield(L, -2, "details") != LUA_TTABLE) {
    lua_pop(L, 1);
    lua_createtable(L, 0, 2);
    lua_pushvalue(L, -1);
    lua_setfield(L, -4, "details");
  }
  lua_insert(L, -2);
  lua_setfield(L, -2, key);
  lua_pop(L, 1);
}

int mg_push_error(lua_State *L, const char *code, int retryable, const char *message) {
  lua_pushnil(L);
  lua_pushstring(L, message);
  mg_error_new(L, code, retryable);
  return 2;
}

/* new(code, message [, retryable [, details]]) -> err */
static int l_new(lua_State *L) {
  const char *code = luaL_checkstring(L, 1);
  luaL_checkstring(L, 2);
  int retryable = lua_toboolean(L, 3);
  if (!lua_isnoneornil(L, 4)) luaL_checktype(L, 4, LUA_TTABLE);
  lua_settop(L, 4);
  lua_pushvalue(L, 2);
  mg_error_new(L, code, retryable);
  if (!lua_isnil(L, 4)) {
    lua_pushvalue(L, 4);
    lua_setfield(L, -2, "details");
  }
  return 1;
}

/* is(v) -> whether v is an error value */
static int l_is(lua_State *L) {
  int is = 0;
  if (lua_type(L, 1) == LUA_TTABLE && lua_getmetatable(L, 1)) {
    luaL_getmetatable(L, ERROR_MT);
    is = lua_rawequal(L, -1, -2);
  }
  lua_pushboolean(L, is);
  return 1;
}

int mg_open_errors(lua_State *L) {
  push_metatable(L);
  lua_pop(L, 1);
  static const luaL_Reg funcs[] = {{"new", l_new}, {"is", l_is}, {NULL, NULL}};
  luaL_newlib(L, funcs);
  luaL_getmetatable(L, ERROR_MT);
  lua_setfield(L, -2, "metatable");
  return 1;
}
