/*
** loop.c — the event loop and the coroutine scheduler.
**
** Owns the process-wide libuv loop, every task (a Lua coroutine plus its
** state), the ready queue, and the waiter protocol that I/O primitives use
** (see mg.h). The scheduler is the only code that resumes coroutines: libuv
** callbacks only mark waiters ready, and `run_until` drains the queue
** between turns of the loop, so Lua never runs re-entrantly from a callback.
**
** A task's userdata is anchored in the registry while the task is alive;
** its coroutine hangs off the userdata (user value 1), so results stay on
** the finished coroutine's stack until the last handle to the task goes.
*/
#include "mg.h"

#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define TASK_MT "moongraph.task"

typedef enum { T_READY, T_RUNNING, T_WAITING, T_DONE } task_state;
typedef enum { RES_OK, RES_FAILED, RES_CANCELLED } task_result;

typedef struct join_wait join_wait;

struct mg_task {
  lua_State *co;
  int self_ref;             /* registry anchor while alive, LUA_NOREF after */
  task_state state;
  task_result result;
  int nargs;                /* values to pass on the next resume */
  int nresults;             /* values left on co's stack when done */
  int observed;             /* someone joined (or the failure was reported) */
  mg_waiter *waiter;        /* pending while T_WAITING */
  mg_waiter *woken;         /* woken waiter whose continuation has not run */
  int waiter_external;      /* the pending waiter is backed by I/O/timers */
  mg_task *next_ready;
  mg_task *prev_live, *next_live;
  join_wait *joiners;
};

struct join_wait {
  mg_waiter w;
  mg_task *target;
  join_wait *prev, *next;
  uv_timer_t *timer;        /* optional timeout */
  int timed_out;
};

static struct {
  uv_loop_t *loop;
  mg_task *ready_head, *ready_tail;
  int ready_count;
  mg_task *live;            /* every task not yet done */
  mg_task *current;
  int io_waiting;           /* waiters that an outside event can wake */
  int running;              /* inside run_until */
  mg_task *interrupt_target;
  volatile sig_atomic_t interrupted;
  uv_async_t interrupt_async;
  int interrupt_installed;
  lua_State *hook_L;
} S;

uv_loop_t *mg_loop(void) {
  if (!S.loop) S.loop = uv_default_loop();
  return S.loop;
}

mg_task *mg_current(lua_State *L) {
  mg_task *t = *(mg_task **)lua_getextraspace(L);
  return t;
}

/* ---------------------------------------------------------------- queue */

static void enqueue(mg_task *t) {
  t->state = T_READY;
  t->next_ready = NULL;
  if (S.ready_tail) S.ready_tail->next_ready = t;
  else S.ready_head = t;
  S.ready_tail = t;
  S.ready_count++;
}

static mg_task *dequeue(void) {
  mg_task *t = S.ready_head;
  if (t) {
    S.ready_head = t->next_ready;
    if (!S.ready_head) S.ready_tail = NULL;
    t->next_ready = NULL;
    S.ready_count--;
  }
  return t;
}

static void unqueue(mg_task *t) {
  mg_task **p = &S.ready_head, *prev = NULL;
  while (*p && *p != t) { prev = *p; p = &(*p)->next_ready; }
  if (!*p) return;
  *p = t->next_ready;
  if (S.ready_tail == t) S.ready_tail = prev;
  t->next_ready = NULL;
  S.ready_count--;
}

static void live_add(mg_task *t) {
  t->prev_live = NULL;
  t->next_live = S.live;
  if (S.live) S.live->prev_live = t;
  S.live = t;
}

static void live_remove(mg_task *t) {
  if (t->prev_live) t->prev_live->next_live = t->next_live;
  else if (S.live == t) S.live = t->next_live;
  if (t->next_live) t->next_live->prev_live = t->prev_live;
  t->prev_live = t->next_live = NULL;
}

/* -------------------------------------------------------------- waiters */

void mg_check_yieldable(lua_State *L, const char *what) {
  mg_task *t = mg_current(L);
  if (!t)
    luaL_error(L, "%s: not inside a moongraph task (use mg.run(fn) or "
                  "mg.spawn(fn); a plain coroutine cannot wait on I/O)", what);
  if (!lua_isyieldable(L))
    luaL_error(L, "%s: cannot wait here: Lua cannot yield inside a C call "
                  "boundary (table.sort comparator, __gc, metamethod called "
                  "from C, or the top level of a required chunk); move the "
                  "call into a function run by a task", what);
}

static int await_(lua_State *L, mg_waiter *w, mg_cancel_fn cancel,
                  lua_KFunction k, lua_KContext ctx, int external) {
  mg_task *t = mg_current(L);
  if (!t || !lua_isyieldable(L)) {
    w->task = NULL;
    if (cancel) cancel(w);
    mg_check_yieldable(L, "wait");
  }
  w->task = t;
  w->cancel = cancel;
  t->waiter = w;
  t->waiter_external = external;
  t->state = T_WAITING;
  if (external) S.io_waiting++;
  return lua_yieldk(L, 0, ctx, k);
}

int mg_await(lua_State *L, mg_waiter *w, mg_cancel_fn cancel,
             lua_KFunction k, lua_KContext ctx) {
  return await_(L, w, cancel, k, ctx, 1);
}

void mg_wake(mg_waiter *w) {
  mg_task *t = w->task;
  if (!t) return;
  w->task = NULL;
  if (t->waiter_external) S.io_waiting--;
  t->waiter = NULL;
  t->woken = w;
  enqueue(t);
}

/* ---------------------------------------------------------------- tasks */

static mg_task *check_task(lua_State *L, int i) {
  return (mg_task *)luaL_checkudata(L, i, TASK_MT);
}

static void wake_joiners(mg_task *t) {
  join_wait *j = t->joiners;
  t->joiners = NULL;
  while (j) {
    join_wait *next = j->next;
    j->prev = j->next = NULL;
    j->target = NULL;       /* unlinked: its cancel must not touch t */
    mg_wake(&j->w);
    j = next;
  }
}

/* Called with the task's final values (or its error) on top of t->co. */
static void finish(lua_State *L, mg_task *t, task_result r, int nvalues) {
  t->state = T_DONE;
  t->result = r;
  t->nresults = nvalues;
  live_remove(t);
  if (r == RES_FAILED && !t->joiners) t->observed = 0;
  else if (t->joiners) t->observed = 1;
  wake_joiners(t);
  luaL_unref(L, LUA_REGISTRYINDEX, t->self_ref);
  t->self_ref = LUA_NOREF;
}

static void report_unobserved(mg_task *t) {
  if (t->state != T_DONE || t->result != RES_FAILED || t->observed) return;
  t->observed = 1;
  const char *msg = lua_tostring(t->co, -1);
  fprintf(stderr, "moongraph: a task failed and was never joined:\n%s\n",
          msg ? msg : "(error object is not a string)");
  fflush(stderr);
}

/* Stop t wherever it is: runs the pending operation's cleanup, closes the
** coroutine's to-be-closed variables, and wakes joiners with "cancelled". */
static void cancel_task(lua_State *L, mg_task *t) {
  if (t->state == T_DONE) return;
  if (t->state == T_WAITING && t->waiter) {
    mg_waiter *w = t->waiter;
    if (t->waiter_external) S.io_waiting--;
    t->waiter = NULL;
    w->task = NULL;
    if (w->cancel) w->cancel(w);
  } else if (t->state == T_READY) {
    unqueue(t);
    if (t->woken) {
      mg_waiter *w = t->woken;
      t->woken = NULL;
      if (w->cancel) w->cancel(w);
    }
  }
  t->woken = NULL;
  lua_resetthread(t->co);
  lua_settop(t->co, 0);
  lua_pushliteral(t->co, "cancelled");
  t->observed = 1;
  finish(L, t, RES_CANCELLED, 1);
}

/* Resume t once and handle how it stopped. */
static void step(lua_State *L, mg_task *t) {
  int nres = 0;
  S.current = t;
  t->state = T_RUNNING;
  t->woken = NULL;
  int nargs = t->nargs;
  t->nargs = 0;
  int st = lua_resume(t->co, L, nargs, &nres);
  S.current = NULL;
  if (st == LUA_YIELD) {
    if (t->state == T_RUNNING) {
      /* a bare coroutine.yield() in a task: let others run, then go on */
      lua_pop(t->co, nres);
      enqueue(t);
    }
    return;
  }
  if (st == LUA_OK) {
    finish(L, t, RES_OK, nres);
    return;
  }
  /* failure: keep the message, add the traceback for string errors */
  if (lua_type(t->co, -1) == LUA_TSTRING) {
    luaL_traceback(L, t->co, lua_tostring(t->co, -1), 0);
  } else {
    lua_pushvalue(t->co, -1);
    lua_xmove(t->co, L, 1);
  }
  lua_resetthread(t->co);
  lua_settop(t->co, 0);
  lua_xmove(L, t->co, 1);
  finish(L, t, RES_FAILED, 1);
}

/* Create a task running the function at stack index fi with the n values
** above it as arguments (all are consumed). Leaves the task on the stack. */
static mg_task *spawn(lua_State *L, int fi, int n) {
  luaL_checktype(L, fi, LUA_TFUNCTION);
  mg_task *t = (mg_task *)lua_newuserdatauv(L, sizeof *t, 1);
  memset(t, 0, sizeof *t);
  luaL_setmetatable(L, TASK_MT);
  t->co = lua_newthread(L);
  *(mg_task **)lua_getextraspace(t->co) = t;
  lua_setiuservalue(L, -2, 1);
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_rotate(L, fi, 1);         /* task below the function */
  lua_xmove(L, t->co, n + 1);   /* function and arguments */
  t->nargs = n;
  t->observed = 1;
  live_add(t);
  enqueue(t);
  return t;
}

static int l_spawn(lua_State *L) {
  int n = lua_gettop(L);
  luaL_checktype(L, 1, LUA_TFUNCTION);
  mg_loop();
  spawn(L, 1, n - 1);
  return 1;
}

static int push_results(lua_State *L, mg_task *t) {
  int n = t->nresults;
  t->observed = 1;
  if (t->result == RES_OK) {
    luaL_checkstack(L, n + 1, "too many results");
    lua_pushboolean(L, 1);
    int base = lua_gettop(t->co) - n;
    for (int i = 1; i <= n; i++) lua_pushvalue(t->co, base + i);
    lua_xmove(t->co, L, n);
    return n + 1;
  }
  lua_pushboolean(L, 0);
  lua_pushvalue(t->co, -1);
  lua_xmove(t->co, L, 1);
  return 2;
}

static void join_timer_closed(uv_handle_t *h) { free(h); }

static void join_free(join_wait *j) {
  if (j->timer) {
    uv_timer_stop(j->timer);
    uv_close((uv_handle_t *)j->timer, join_timer_closed);
    j->timer = NULL;
  }
  free(j);
}

static void join_unlink(join_wait *j) {
  mg_task *t = j->target;
  if (!t) return;
  if (j->prev) j->prev->next = j->next;
  else t->joiners = j->next;
  if (j->next) j->next->prev = j->prev;
  j->prev = j->next = NULL;
  j->target = NULL;
}

static void join_cancel(mg_waiter *w) {
  join_wait *j = (join_wait *)w;
  join_unlink(j);
  join_free(j);
}

static void join_timeout(uv_timer_t *h) {
  join_wait *j = (join_wait *)h->data;
  j->timed_out = 1;
  join_unlink(j);
  mg_wake(&j->w);
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  join_wait *j = (join_wait *)ctx;
  mg_task *t = check_task(L, 1);
  int timed_out = j->timed_out && t->state != T_DONE;
  join_free(j);
  if (timed_out) {
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  return push_results(L, t);
}

static int l_task_join(lua_State *L) {
  mg_task *t = check_task(L, 1);
  double timeout = luaL_optnumber(L, 2, -1);
  if (t->state == T_DONE) return push_results(L, t);
  mg_task *self = mg_current(L);
  if (self == t) return luaL_error(L, "task:join(): a task cannot join itself");
  mg_check_yieldable(L, "task:join");
  join_wait *j = (join_wait *)calloc(1, sizeof *j);
  if (!j) return luaL_error(L, "out of memory");
  j->target = t;
  j->next = t->joiners;
  if (t->joiners) t->joiners->prev = j;
  t->joiners = j;
  if (timeout >= 0) {
    j->timer = (uv_timer_t *)malloc(sizeof *j->timer);
    uv_timer_init(mg_loop(), j->timer);
    j->timer->data = j;
    uv_timer_start(j->timer, join_timeout, (uint64_t)(timeout * 1000 + 0.5), 0);
  }
  /* A join can only be woken from outside when it has a timer, or when the
  ** target itself is waiting on I/O; the deadlock check counts timers. */
  return await_(L, &j->w, join_cancel, join_k, (lua_KContext)j,
                j->timer != NULL);
}

static int l_task_cancel(lua_State *L) {
  mg_task *t = check_task(L, 1);
  if (t->state == T_DONE) { lua_pushboolean(L, 0); return 1; }
  if (t == mg_current(L))
    return luaL_error(L, "task:cancel(): a task cannot cancel itself "
                         "(return or raise an error instead)");
  if (t->state == T_RUNNING)
    return luaL_error(L, "task:cancel(): the task is resuming another "
                         "coroutine and cannot be cancelled from inside it");
  cancel_task(L, t);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_task_done(lua_State *L) {
  lua_pushboolean(L, check_task(L, 1)->state == T_DONE);
  return 1;
}

static int l_task_status(lua_State *L) {
  static const char *const states[] = {"ready", "running", "waiting", "done"};
  static const char *const results[] = {"ok", "failed", "cancelled"};
  mg_task *t = check_task(L, 1);
  lua_pushstring(L, t->state == T_DONE ? results[t->result] : states[t->state]);
  return 1;
}

static int l_task_tostring(lua_State *L) {
  mg_task *t = check_task(L, 1);
  lua_pushfstring(L, "task: %p", (void *)t);
  return 1;
}

static int l_task_gc(lua_State *L) {
  mg_task *t = (mg_task *)lua_touserdata(L, 1);
  if (t->state == T_DONE) report_unobserved(t);
  return 0;
}

/* ---------------------------------------------------------------- sleep */

typedef struct {
  mg_waiter w;
  uv_timer_t timer;
} sleep_op;

static void sleep_closed(uv_handle_t *h) { free(h->data); }

static void sleep_fired(uv_timer_t *h) { mg_wake(&((sleep_op *)h->data)->w); }

static void sleep_cancel(mg_waiter *w) {
  sleep_op *op = (sleep_op *)w;
  uv_timer_stop(&op->timer);
  uv_close((uv_handle_t *)&op->timer, sleep_closed);
}

static int sleep_k(lua_State *L, int status, lua_KContext ctx) {
  (void)L; (void)status;
  sleep_op *op = (sleep_op *)ctx;
  uv_close((uv_handle_t *)&op->timer, sleep_closed);
  return 0;
}

static int yield_k(lua_State *L, int status, lua_KContext ctx) {
  (void)L; (void)status; (void)ctx;
  return 0;
}

static int l_sleep(lua_State *L) {
  double sec = luaL_checknumber(L, 1);
  luaL_argcheck(L, sec >= 0 && sec == sec, 1, "must be a non-negative number");
  mg_check_yieldable(L, "mg.sleep");
  if (sec == 0) {
    /* back of the ready queue: every task ready now runs first */
    enqueue(mg_current(L));
    return lua_yieldk(L, 0, 0, yield_k);
  }
  sleep_op *op = (sleep_op *)malloc(sizeof *op);
  if (!op) return luaL_error(L, "out of memory");
  uv_timer_init(mg_loop(), &op->timer);
  op->timer.data = op;
  uv_timer_start(&op->timer, sleep_fired, (uint64_t)(sec * 1000 + 0.5), 0);
  return mg_await(L, &op->w, sleep_cancel, sleep_k, (lua_KContext)op);
}

static int l_now(lua_State *L) {
  lua_pushnumber(L, (double)uv_hrtime() / 1e9);
  return 1;
}

static int l_current(lua_State *L) {
  mg_task *t = mg_current(L);
  if (!t || t->self_ref == LUA_NOREF) { lua_pushnil(L); return 1; }
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  return 1;
}

/* ------------------------------------------------------------ park/unpark */

/* park([timeout]) suspends the running task until unpark(task, value) or the
** timeout; it returns (true, value) or (nil, "timeout"). The Lua side builds
** queues and events on it. A park without timeout can only be woken by
** another task, so it does not count as pending I/O. */
typedef struct {
  mg_waiter w;
  uv_timer_t *timer;
  int timed_out;
  int value_ref;
} park_op;

static void park_free(park_op *op) {
  if (op->timer) {
    uv_timer_stop(op->timer);
    uv_close((uv_handle_t *)op->timer, join_timer_closed);
  }
  free(op);
}

static void park_timeout(uv_timer_t *h) {
  park_op *op = (park_op *)h->data;
  op->timed_out = 1;
  mg_wake(&op->w);
}

static void park_cancel(mg_waiter *w) {
  park_free((park_op *)w);
}

static int park_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  park_op *op = (park_op *)ctx;
  int timed_out = op->timed_out && op->value_ref == LUA_NOREF;
  if (timed_out) {
    park_free(op);
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, op->value_ref);
  luaL_unref(L, LUA_REGISTRYINDEX, op->value_ref);
  park_free(op);
  return 2;
}

static int l_park(lua_State *L) {
  double timeout = luaL_optnumber(L, 1, -1);
  mg_check_yieldable(L, "park");
  park_op *op = (park_op *)calloc(1, sizeof *op);
  if (!op) return luaL_error(L, "out of memory");
  op->value_ref = LUA_NOREF;
  if (timeout >= 0) {
    op->timer = (uv_timer_t *)malloc(sizeof *op->timer);
    uv_timer_init(mg_loop(), op->timer);
    op->timer->data = op;
    uv_timer_start(op->timer, park_timeout, (uint64_t)(timeout * 1000 + 0.5), 0);
  }
  return await_(L, &op->w, park_cancel, park_k, (lua_KContext)op,
                op->timer != NULL);
}

static int l_unpark(lua_State *L) {
  mg_task *t = check_task(L, 1);
  lua_settop(L, 2);
  if (t->state != T_WAITING || !t->waiter || t->waiter->cancel != park_cancel) {
    lua_pushboolean(L, 0);
    return 1;
  }
  park_op *op = (park_op *)t->waiter;
  op->value_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  mg_wake(&op->w);
  lua_pushboolean(L, 1);
  return 1;
}

/* ------------------------------------------------------------ interrupt */

static void interrupt_hook(lua_State *L, lua_Debug *ar) {
  (void)ar;
  lua_sethook(L, NULL, 0, 0);
  luaL_error(L, "interrupted");
}

static void on_sigint(int sig) {
  (void)sig;
  S.interrupted = 1;
  if (S.current)
    lua_sethook(S.current->co, interrupt_hook,
                LUA_MASKCALL | LUA_MASKRET | LUA_MASKCOUNT, 1);
  uv_async_send(&S.interrupt_async);
}

static void interrupt_wakeup(uv_async_t *h) { (void)h; }

void mg_install_interrupt(lua_State *L) {
  (void)L;
  if (S.interrupt_installed) return;
  uv_async_init(mg_loop(), &S.interrupt_async, interrupt_wakeup);
  uv_unref((uv_handle_t *)&S.interrupt_async);
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_sigint;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, NULL);
  S.interrupt_installed = 1;
}


/* -------------------------------------------------------------- driving */

static int l_install_interrupt(lua_State *L) {
  mg_install_interrupt(L);
  return 0;
}

static void handle_interrupt(lua_State *L) {
  if (!S.interrupted) return;
  S.interrupted = 0;
  if (S.current == NULL && S.interrupt_target &&
      S.interrupt_target->state != T_DONE)
    cancel_task(L, S.interrupt_target);
}

/* Run until `until` is done (or, when NULL, until no task can make
** progress). Returns 0, or -1 when `until` can never finish (deadlock). */
static int run_until(lua_State *L, mg_task *until) {
  mg_loop();
  for (;;) {
    /* one pass over the tasks that are ready now; newcomers wait a turn so
    ** a task that keeps yielding cannot starve I/O */
    for (int n = S.ready_count; n > 0; n--) {
      mg_task *t = dequeue();
      if (!t) break;
      step(L, t);
      handle_interrupt(L);
    }
    handle_interrupt(L);
    if (until && until->state == T_DONE) return 0;
    if (S.ready_head) {
      uv_run(S.loop, UV_RUN_NOWAIT);
      continue;
    }
    if (S.io_waiting == 0) return until ? -1 : 0;
    uv_run(S.loop, UV_RUN_ONCE);
  }
}

static void cancel_all(lua_State *L) {
  while (S.live) cancel_task(L, S.live);
  uv_run(S.loop, UV_RUN_NOWAIT);  /* let close callbacks free the handles */
}

/* How run_impl treats the tasks still alive when the main one is done. */
enum { RUN_CANCEL_REST, RUN_WAIT_ALL, RUN_KEEP_REST };

/* core.run(fn, ...) -> results of fn, or raises its error; tasks still alive
** afterwards are cancelled. core.run_all waits for every task first (the
** CLI's semantics for scripts); core.run_keep leaves them suspended for the
** next run (the REPL: tasks spawned at the prompt live on). */
static int run_impl(lua_State *L, int mode) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (S.running || mg_current(L))
    return luaL_error(L, "mg.run: the loop is already running (inside a "
                         "task, use mg.spawn and task:join instead)");
  S.running = 1;
  int n = lua_gettop(L);
  mg_task *main = spawn(L, 1, n - 1);
  mg_task *prev_target = S.interrupt_target;
  S.interrupt_target = main;
  int rc = run_until(L, main);
  if (rc == 0 && mode == RUN_WAIT_ALL) run_until(L, NULL);
  S.interrupt_target = prev_target;
  if (mode != RUN_KEEP_REST) cancel_all(L);
  else uv_run(S.loop, UV_RUN_NOWAIT);
  S.running = 0;
  if (rc < 0) {
    return luaL_error(L, "mg.run: the main task is waiting for something "
                         "that can never happen (no pending I/O or timers)");
  }
  main->observed = 1;
  if (main->result == RES_OK) {
    int k = push_results(L, main);
    lua_remove(L, -k);            /* drop the `true` */
    return k - 1;
  }
  lua_pushvalue(main->co, -1);
  lua_xmove(main->co, L, 1);
  return lua_error(L);
}

static int l_run(lua_State *L) { return run_impl(L, RUN_CANCEL_REST); }
static int l_run_all(lua_State *L) { return run_impl(L, RUN_WAIT_ALL); }
static int l_run_keep(lua_State *L) { return run_impl(L, RUN_KEEP_REST); }

static int l_running(lua_State *L) {
  lua_pushboolean(L, S.running);
  return 1;
}

static const luaL_Reg task_methods[] = {
  {"join", l_task_join},
  {"cancel", l_task_cancel},
  {"done", l_task_done},
  {"status", l_task_status},
  {NULL, NULL}
};

static const luaL_Reg loop_funcs[] = {
  {"run", l_run},
  {"run_all", l_run_all},
  {"run_keep", l_run_keep},
  {"running", l_running},
  {"spawn", l_spawn},
  {"sleep", l_sleep},
  {"now", l_now},
  {"current", l_current},
  {"park", l_park},
  {"unpark", l_unpark},
  {"install_interrupt", l_install_interrupt},
  {NULL, NULL}
};

int mg_open_loop(lua_State *L) {
  mg_loop();
  if (luaL_newmetatable(L, TASK_MT)) {
    luaL_newlib(L, task_methods);
    lua_setfield(L, -2, "__index");
    lua_pushcfunction(L, l_task_gc);
    lua_setfield(L, -2, "__gc");
    lua_pushcfunction(L, l_task_tostring);
    lua_setfield(L, -2, "__tostring");
  }
  lua_pop(L, 1);
  luaL_newlib(L, loop_funcs);
  return 1;
}
