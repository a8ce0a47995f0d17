/*
** json_harness.h — the Lua state of the JSON fuzz harnesses: the standard
** libraries, runtime/lua on the path (run from the repository root), no
** lua-cjson, and moongraph.core holding only the C JSON module, so that
** require "moongraph.json" pairs the C codec with the Lua one it is held to.
** SAME(a, b): the two values equal down to integer and float subtypes,
** metatables (the array marker) and keys.
*/
#ifndef JSON_HARNESS_H
#define JSON_HARNESS_H

#include <stdlib.h>

#include <lauxlib.h>
#include <lua.h>
#include <lualib.h>

int mg_open_json(lua_State *L);

static lua_State *json_harness_state(void) {
  lua_State *L = luaL_newstate();
  luaL_openlibs(L);
  if (luaL_dostring(L,
        "package.path = 'runtime/lua/?.lua;' .. package.path\n"
        "package.preload['cjson'] = function() error('no cjson in the harness') end\n"
        "function SAME(a, b)\n"
        "  if type(a) ~= type(b) or math.type(a) ~= math.type(b) then return false end\n"
        "  if type(a) ~= 'table' then return a == b or (a ~= a and b ~= b) end\n"
        "  if getmetatable(a) ~= getmetatable(b) then return false end\n"
        "  for k, x in pairs(a) do if not SAME(x, b[k]) then return false end end\n"
        "  for k in pairs(b) do if a[k] == nil then return false end end\n"
        "  return true\n"
        "end\n") != LUA_OK)
    abort();
  /* package.loaded["moongraph.core"] = { json = <the C module> } */
  mg_open_json(L);
  lua_newtable(L);
  lua_insert(L, -2);
  lua_setfield(L, -2, "json");
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "loaded");
  lua_pushvalue(L, -3);
  lua_setfield(L, -2, "moongraph.core");
  lua_pop(L, 3);
  return L;
}

#endif
