/*
** core.c — the `moongraph.core` Lua module.
**
** Gathers the runtime's sub-modules into one table: core.loop, core.sse,
** core.http, core.redis, core.pg, core.files, core.signal, core.process, core.json,
** core.pack, core.server. Sub-modules are referenced weakly, so a build that leaves one
** out still links; the Lua side reports a missing one clearly when it is
** required.
*/
#include "mg.h"

#pragma weak mg_open_sse
#pragma weak mg_open_http
#pragma weak mg_open_redis
#pragma weak mg_open_pg
#pragma weak mg_open_files
#pragma weak mg_open_signal
#pragma weak mg_open_process
#pragma weak mg_open_json
#pragma weak mg_open_pack
#pragma weak mg_open_server

void mg_register_class(lua_State *L, const char *name, const luaL_Reg *methods,
                       lua_CFunction gc, lua_CFunction close,
                       lua_CFunction tostring) {
  if (luaL_newmetatable(L, name)) {
    lua_newtable(L);
    luaL_setfuncs(L, methods, 0);
    lua_setfield(L, -2, "__index");
    const struct { const char *event; lua_CFunction fn; } meta[] = {
      {"__gc", gc}, {"__close", close}, {"__tostring", tostring},
    };
    for (size_t i = 0; i < sizeof meta / sizeof meta[0]; i++) {
      if (!meta[i].fn) continue;
      lua_pushcfunction(L, meta[i].fn);
      lua_setfield(L, -2, meta[i].event);
    }
  }
  lua_pop(L, 1);
}

int luaopen_moongraph_core(lua_State *L) {
  const struct { const char *name; lua_CFunction open; } subs[] = {
    {"loop", mg_open_loop},
    {"sse", mg_open_sse},
    {"http", mg_open_http},
    {"redis", mg_open_redis},
    {"pg", mg_open_pg},
    {"files", mg_open_files},
    {"signal", mg_open_signal},
    {"process", mg_open_process},
    {"json", mg_open_json},
    {"pack", mg_open_pack},
    {"bytes", mg_open_bytes},
    {"codepoints", mg_open_codepoints},
    {"sentences", mg_open_sentences},
    {"server", mg_open_server},
    {"errors", mg_open_errors},
  };
  lua_newtable(L);
  for (size_t i = 0; i < sizeof subs / sizeof subs[0]; i++) {
    if (!subs[i].open) continue;
    lua_pushcfunction(L, subs[i].open);
    lua_call(L, 0, 1);
    lua_setfield(L, -2, subs[i].name);
  }
  /* core.files was core.store in earlier versions */
  lua_getfield(L, -1, "files");
  lua_setfield(L, -2, "store");
  lua_pushliteral(L, MG_VERSION);
  lua_setfield(L, -2, "version");
  return 1;
}
