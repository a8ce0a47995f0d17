/*
** signal.c — waiting for process signals in a task.
**
** core.signal.wait(name) suspends the calling task until the process
** receives that signal ("TERM", "HUP", "INT", "USR1", "USR2", "QUIT") and
** returns its name. The first wait for a signal installs a libuv watcher
** that stays installed for the life of the process, so from then on the
** signal never takes its default action (for TERM and HUP: exit), and one
** that arrives while nobody waits is kept and returned by the next wait.
** Every task waiting when the signal arrives is woken. The watcher keeps
** the loop alive only while some task waits on it. For TERM and INT the
** watchdog (watchdog.c) sees the signal first: a task that holds the loop
** meanwhile is stopped, so the signal is not lost behind it.
*/
#include "mg.h"

#include <signal.h>
#include <stdlib.h>
#include <string.h>

typedef struct signal_op signal_op;

typedef struct {
  const char *name;
  int signum;
  int started;
  int pending;              /* arrived while nobody waited */
  uv_signal_t handle;
  signal_op *waiters;
} watch;

struct signal_op {
  mg_waiter w;
  watch *watch;
  signal_op *prev, *next;
};

static watch watches[] = {
  {"TERM", SIGTERM, 0, 0, {0}, NULL}, {"HUP", SIGHUP, 0, 0, {0}, NULL},
  {"INT", SIGINT, 0, 0, {0}, NULL},   {"USR1", SIGUSR1, 0, 0, {0}, NULL},
  {"USR2", SIGUSR2, 0, 0, {0}, NULL}, {"QUIT", SIGQUIT, 0, 0, {0}, NULL},
};

static void unlink_op(signal_op *op) {
  watch *wa = op->watch;
  if (op->prev) op->prev->next = op->next;
  else if (wa->waiters == op) wa->waiters = op->next;
  if (op->next) op->next->prev = op->prev;
  op->prev = op->next = NULL;
  if (!wa->waiters) uv_unref((uv_handle_t *)&wa->handle);
}

static void signal_received(uv_signal_t *h, int signum) {
  mg_watchdog_signal_seen(signum);
  watch *wa = (watch *)h->data;
  if (!wa->waiters) { wa->pending++; return; }
  while (wa->waiters) {
    signal_op *op = wa->waiters;
    unlink_op(op);
    mg_wake(&op->w);
  }
}

static void signal_cancel(mg_waiter *w) {
  signal_op *op = (signal_op *)w;
  if (op->watch->waiters == op || op->prev) unlink_op(op);
  free(op);
}

static int signal_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  signal_op *op = (signal_op *)ctx;
  lua_pushstring(L, op->watch->name);
  free(op);
  return 1;
}

static int l_wait(lua_State *L) {
  const char *name = luaL_checkstring(L, 1);
  if (strncmp(name, "SIG", 3) == 0) name += 3;
  watch *wa = NULL;
  for (size_t i = 0; i < sizeof watches / sizeof watches[0]; i++)
    if (strcmp(watches[i].name, name) == 0) wa = &watches[i];
  if (!wa)
    return luaL_argerror(L, 1, "unknown signal (TERM, HUP, INT, USR1, USR2, QUIT)");
  mg_check_yieldable(L, "signal.wait");
  if (!wa->started) {
    uv_signal_init(mg_loop(), &wa->handle);
    wa->handle.data = wa;
    uv_signal_start(&wa->handle, signal_received, wa->signum);
    uv_unref((uv_handle_t *)&wa->handle);
    wa->started = 1;
    /* TERM and INT stop the process even while a task holds the loop */
    mg_watchdog_signal(wa->signum);
  }
  if (wa->pending > 0) {
    wa->pending--;
    lua_pushstring(L, wa->name);
    return 1;
  }
  signal_op *op = (signal_op *)calloc(1, sizeof *op);
  if (!op) return luaL_error(L, "out of memory");
  op->watch = wa;
  op->next = wa->waiters;
  if (wa->waiters) wa->waiters->prev = op;
  wa->waiters = op;
  uv_ref((uv_handle_t *)&wa->handle);
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
