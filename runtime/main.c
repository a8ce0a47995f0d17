/*
** main.c — the `moongraph` executable.
**
** Sets up a Lua state with the runtime built in: moongraph.core is
** preloaded, the Lua half of the runtime is served from the copy embedded
** at build time (only MOONGRAPH_PATH, a development checkout, wins over it),
** and the command line is handed to the Lua module moongraph.cli, whose
** return value is the exit status.
*/
#include "mg.h"
#include "alloc.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <lualib.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

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

/* package.searchers entry: finds a module in the MOONGRAPH_PATH directories
** (upvalue 1: their ?.lua and ?/init.lua templates). */
static int search_moongraph_path(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  const char *path = lua_tostring(L, lua_upvalueindex(1));
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "searchpath");
  lua_pushstring(L, name);
  lua_pushstring(L, path);
  lua_call(L, 2, 2);
  if (lua_isnil(L, -2)) return 1;   /* the list of files tried */
  const char *file = lua_tostring(L, -2);
  if (luaL_loadfile(L, file) != LUA_OK)
    return luaL_error(L, "error loading module '%s' from file '%s':\n\t%s",
                      name, file, lua_tostring(L, -1));
  lua_pushstring(L, file);
  return 2;
}

/* package.searchers entry in place of Lua's own file searcher: the same
** search of package.path, with compiled chunks kept between processes by
** moongraph.chunkcache (itself served by the searchers before this one). */
static int search_lua_files(lua_State *L) {
  lua_getglobal(L, "require");
  lua_pushliteral(L, "moongraph.chunkcache");
  lua_call(L, 1, 1);
  lua_getfield(L, -1, "searcher");
  lua_pushvalue(L, 1);
  lua_call(L, 1, 2);
  return 2;
}

/* Insert a searcher at position pos of package.searchers (on the stack top). */
static void insert_searcher(lua_State *L, int pos) {
  lua_Integer n = luaL_len(L, -2);
  for (lua_Integer i = n; i >= pos; i--) {
    lua_rawgeti(L, -2, i);
    lua_rawseti(L, -3, i + 1);
  }
  lua_rawseti(L, -2, pos);
}

/* Applications (scripts/, nodes/, prompts/, data/) are found beside the
** binary as well as in the working directory, so `moongraph chat` works from
** anywhere: the directory of the executable (a checkout), then
** <that>/../share/moongraph (`make install-app`). They go after package.path,
** whose ./?.lua lets the working directory win. package is on the top. */
static void add_app_roots(lua_State *L) {
  char exe[PATH_MAX];
  ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
  if (n <= 0) return;
  exe[n] = '\0';
  char *slash = strrchr(exe, '/');
  if (!slash) return;
  *slash = '\0';
  lua_getfield(L, -1, "path");
  lua_pushfstring(L, ";%s/?.lua;%s/?/init.lua;%s/../share/moongraph/?.lua;"
                     "%s/../share/moongraph/?/init.lua", exe, exe, exe, exe);
  lua_concat(L, 2);
  lua_setfield(L, -2, "path");
}

/* Module search order: preloaded C modules, the directories of
** MOONGRAPH_PATH (a ;-separated list: a development checkout wins), the Lua
** half of the runtime embedded in this binary (so an older copy installed
** under package.path never shadows it), then package.path and cpath
** (applications, scripts, other libraries). */
static void setup_package(lua_State *L) {
  lua_getglobal(L, "package");
  lua_getfield(L, -1, "preload");
  lua_pushcfunction(L, luaopen_moongraph_core);
  lua_setfield(L, -2, "moongraph.core");
  lua_pushcfunction(L, mg_open_repl);
  lua_setfield(L, -2, "moongraph.repl_core");
  lua_pop(L, 1);

  lua_getfield(L, -1, "searchers");
  lua_pushcfunction(L, search_lua_files);
  lua_rawseti(L, -2, 2);            /* Lua's own file searcher */
  lua_pushcfunction(L, search_embedded);
  insert_searcher(L, 2);

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
    luaL_pushresult(&b);
    /* the same directories also serve `require` of non-runtime modules */
    lua_pushvalue(L, -1);
    lua_getfield(L, -4, "path");
    lua_concat(L, 2);
    lua_setfield(L, -4, "path");
    lua_pushcclosure(L, search_moongraph_path, 1);
    insert_searcher(L, 2);
  }
  lua_pop(L, 1);
  add_app_roots(L);
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

/* A standard descriptor the caller closed (`moongraph ... >&-`) would be
** reused by the next file opened, and output meant for the terminal would
** land in a checkpoint. Hold such slots with /dev/null opened read-only, so
** writes to them fail (EBADF) and are reported at exit. */
static void hold_std_fds(void) {
  for (int fd = 0; fd <= 2; fd++) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int got = open("/dev/null", O_RDONLY);
    if (got >= 0 && got != fd) { dup2(got, fd); close(got); }
  }
}

/* What luaL_newstate would install, for a state on our own allocator: an
** error outside any protected call is reported before Lua aborts, and
** warn() writes to stderr once a script turns warnings on with "@on". */
static int panic(lua_State *L) {
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "moongraph: unprotected Lua error: %s\n", msg ? msg : "(not a string)");
  return 0;
}

static int warnings_on = 0, warning_open = 0;

static void warnf(void *ud, const char *msg, int tocont) {
  (void)ud;
  if (!warning_open && !tocont && msg[0] == '@') {    /* a control message */
    if (strcmp(msg, "@on") == 0) warnings_on = 1;
    else if (strcmp(msg, "@off") == 0) warnings_on = 0;
    return;
  }
  if (warnings_on) {
    if (!warning_open) fputs("Lua warning: ", stderr);
    fputs(msg, stderr);
    if (!tocont) fputc('\n', stderr);
  }
  warning_open = tocont;
}

int main(int argc, char **argv) {
  hold_std_fds();
  mg_alloc *heap = mg_alloc_new();
  lua_State *L = heap ? lua_newstate(mg_alloc_f, heap) : NULL;
  if (!L) { fputs("moongraph: cannot create Lua state\n", stderr); return 1; }
  lua_atpanic(L, panic);
  lua_setwarnf(L, warnf, NULL);
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
  lua_close(L);
  mg_alloc_free(heap);
  /* output the caller did not get is a failure, even when the command
  ** itself succeeded */
  errno = 0;
  int flushed = fflush(stdout) == 0;
  if ((!flushed || ferror(stdout)) && code == 0) {
    fprintf(stderr, "moongraph: error writing to standard output: %s\n",
            !flushed && errno ? strerror(errno) : "a write failed");
    code = 1;
  }
  return code;
}
