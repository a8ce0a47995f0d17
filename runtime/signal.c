/*
** signal.c — waiting for process signals in a task.
**
** core.signal.wait(name) suspends the calling task until the process
** receives that signal ("TERM", "HUP", "INT", "USR1", "USR2", "QUIT"), and
** returns its name. Delivery goes through libuv's signal watcher, so the
** handler itself never runs Lua. While a task waits for a signal, the
** signal's default action (for TERM: exit) is replaced by the wake-up, and
** the wait counts as pending I/O (it keeps `moongraph run` alive).
*/
#include "mg.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

typedef struct {
  mg_waiter w;
  uv_signal_t handle;
  int signum;
} signal_op;

static const struct { const char *name; int signum; } signals[] = {
  {"TERM", SIGTERM}, {"HUP", SIGHUP}, {"INT", SIGINT},
  {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"QUIT", SIGQUIT},
};

static void signal_closed(uv_handle_t *h) { free(h->data); }

static void signal_received(uv_signal_t *h, int signum) {
  (void)signum;
  signal_op *op = (signal_op *)h->data;
  uv_signal_stop(h);
  mg_wake(&op->w);
}

static void signal_cancel(mg_waiter *w) {
  signal_op *op = (signal_op *)w;
  uv_signal_stop(&op->handle);
  uv_close((uv_handle_t *)&op->handle, signal_closed);
}

static int signal_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  signal_op *op = (signal_op *)ctx;
  for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
    if (signals[i].signum == op->signum) lua_pushstring(L, signals[i].name);
  uv_close((uv_handle_t *)&op->handle, signal_closed);
  return 1;
}

static int l_wait(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  if (strncmp(name, "SIG", 3) == 0) name += 3;
  int signum = 0;
  for (size_t i = 0; i < sizeof signals / sizeof signals[0]; i++)
    if (strcmp(signals[i].name, name) == 0) signum = signals[i].signum;
  if (!signum)
    return luaL_argerror(L, 1, "unknown signal (TERM, HUP, INT, USR1, USR2, QUIT)");
  mg_check_yieldable(L, "signal.wait");
  signal_op *op = (signal_op *)calloc(1, sizeof *op);
  if (!op) return luaL_error(L, "out of memory");
  op->signum = signum;
  uv_signal_init(mg_loop(), &op->handle);
  op->handle.data = op;
  uv_signal_start(&op->handle, signal_received, signum);
  return mg_await(L, &op->w, signal_cancel, signal_k, (lua_KContext)op);
}

static const luaL_Reg signal_funcs[] = {
  {"wait", l_wait},
  {NULL, NULL}
};

int mg_open_signal(lua_State *L) {
  luaL_newlib(L, signal_funcs);
  return 1;
}
