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
#define POOL_MAX 1024       /* finished coroutines kept for reuse */

/* User values of a task's userdata. */
enum { UV_CO = 1, UV_RESULT, UV_WAKE_VALUE, UV_COUNT = UV_WAKE_VALUE };

typedef enum { T_READY, T_RUNNING, T_WAITING, T_DONE } task_state;
typedef enum { RES_OK, RES_FAILED, RES_CANCELLED } task_result;

typedef struct join_wait {
  mg_waiter w;
  mg_task *target;
  struct join_wait *prev, *next;
} join_wait;

struct mg_task {
  lua_State *co;            /* NULL once done (the coroutine is recycled) */
  int self_ref;             /* registry anchor while alive, LUA_NOREF after */
  task_state state;
  task_result result;
  int nargs;                /* values to pass on the next resume */
  int nresults;             /* results kept in UV_RESULT (a table if > 1) */
  int observed;             /* someone joined (or the failure was reported) */
  int waiter_external;      /* the pending waiter is backed by I/O/timers */
  int timed_out;            /* the deadline woke the last wait */
  mg_waiter *waiter;        /* pending while T_WAITING */
  mg_waiter *woken;         /* woken waiter whose continuation has not run */
  mg_task *next_ready;
  mg_task *prev_live, *next_live;
  join_wait *joiners;       /* tasks waiting for this one */
  /* the single wait a task can be in, embedded to avoid allocations */
  join_wait join;
  mg_waiter sleep_w, wake_w;
  /* deadline of the current wait (sleep, or a join/suspend timeout) */
  uint64_t due_ns, due_seq;
  /* the task's own deadline (uv_hrtime ns; 0 = none): set by mg.timeout,
  ** inherited by the tasks it spawns; calls made by the task are bounded by
  ** it (mg_call_budget) */
  uint64_t limit_ns;
  /* the watchdog's limit on one resume (ns; 0 = not watched, -1 = the
  ** process default), inherited by the tasks it spawns */
  int64_t watch_ns;
  size_t heap_idx;          /* 1-based position in the deadline heap; 0 = none */
};

#define TASK_OF(ptr, field) ((mg_task *)((char *)(ptr) - offsetof(mg_task, field)))

static struct {
  uv_loop_t *loop;
  mg_task *ready_head, *ready_tail;
  int ready_count;
  mg_task *live;            /* every task not yet done */
  mg_task *current;
  int io_waiting;           /* waiters that an outside event can wake */
  int running;              /* inside run_until */
  int in_uv_run;            /* inside uv_run: a wake must end its turn */
  int interrupted_rest;     /* Ctrl-C cancelled the tasks left after main */
  mg_task *interrupt_target;
  volatile sig_atomic_t interrupted;
  uv_async_t interrupt_async;
  int interrupt_installed;
  int pool_ref, pool_n;     /* registry table of idle coroutines */
  /* deadline heap: one libuv timer serves every sleep and timeout */
  mg_task **heap;
  size_t heap_n, heap_cap;
  uint64_t due_counter;
  uv_timer_t timer;
  uint64_t timer_due;       /* when `timer` fires; 0 = not armed */
  uint64_t watch_default;   /* the watchdog limit of tasks without their own (ns) */
} S;

uv_loop_t *mg_loop(void) {
  if (!S.loop) {
    S.loop = uv_default_loop();
    uv_timer_init(S.loop, &S.timer);
  }
  return S.loop;
}

/* Only the task the scheduler resumed can wait; a coroutine created inside
** it (coroutine.wrap) is not that task. */
mg_task *mg_current(lua_State *L) {
  mg_task *t = S.current;
  return t && t->co == L ? t : NULL;
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
  /* Woken from a libuv callback (say, a timer): without this, the same
  ** loop turn would go on to block in epoll while the task is ready. */
  if (S.in_uv_run) uv_stop(S.loop);
}

/* ------------------------------------------------------------ deadlines */

static int due_before(const mg_task *a, const mg_task *b) {
  return a->due_ns < b->due_ns || (a->due_ns == b->due_ns && a->due_seq < b->due_seq);
}

static void heap_set(size_t i, mg_task *t) {
  S.heap[i] = t;
  t->heap_idx = i + 1;
}

static void heap_up(size_t i) {
  mg_task *t = S.heap[i];
  while (i > 0) {
    size_t parent = (i - 1) / 2;
    if (!due_before(t, S.heap[parent])) break;
    heap_set(i, S.heap[parent]);
    i = parent;
  }
  heap_set(i, t);
}

static void heap_down(size_t i) {
  mg_task *t = S.heap[i];
  for (;;) {
    size_t c = 2 * i + 1;
    if (c >= S.heap_n) break;
    if (c + 1 < S.heap_n && due_before(S.heap[c + 1], S.heap[c])) c++;
    if (!due_before(S.heap[c], t)) break;
    heap_set(i, S.heap[c]);
    i = c;
  }
  heap_set(i, t);
}

static void timer_fired(uv_timer_t *h);

/* Arm the loop timer for the earliest deadline (or stop it). */
static void timer_sync(void) {
  if (S.heap_n == 0) {
    if (S.timer_due) { uv_timer_stop(&S.timer); S.timer_due = 0; }
    return;
  }
  uint64_t due = S.heap[0]->due_ns;
  if (S.timer_due == due) return;
  uint64_t now = uv_hrtime();
  uint64_t ms = due > now ? (due - now + 999999) / 1000000 : 0;
  uv_update_time(S.loop);
  uv_timer_start(&S.timer, timer_fired, ms, 0);
  S.timer_due = due;
}

static int deadline_set(lua_State *L, mg_task *t, double sec) {
  if (S.heap_n == S.heap_cap) {
    size_t cap = S.heap_cap ? S.heap_cap * 2 : 256;
    mg_task **h = (mg_task **)realloc(S.heap, cap * sizeof *h);
    if (!h) return luaL_error(L, "out of memory");
    S.heap = h;
    S.heap_cap = cap;
  }
  t->due_ns = uv_hrtime() + (uint64_t)(sec * 1e9);
  t->due_seq = ++S.due_counter;
  S.heap[S.heap_n++] = t;
  heap_up(S.heap_n - 1);
  if (S.heap[0] == t) timer_sync();
  return 0;
}

static void deadline_clear(mg_task *t) {
  if (!t->heap_idx) return;
  size_t i = t->heap_idx - 1;
  t->heap_idx = 0;
  mg_task *last = S.heap[--S.heap_n];
  if (last != t) {
    S.heap[i] = last;
    last->heap_idx = i + 1;
    if (i > 0 && due_before(last, S.heap[(i - 1) / 2])) heap_up(i);
    else heap_down(i);
  }
  if (i == 0) timer_sync();
}

/* Wake every task whose deadline has passed, earliest (then oldest) first. */
static void timer_fired(uv_timer_t *h) {
  (void)h;
  S.timer_due = 0;
  uint64_t now = uv_hrtime();
  while (S.heap_n && S.heap[0]->due_ns <= now) {
    mg_task *t = S.heap[0];
    t->heap_idx = 0;
    mg_task *last = S.heap[--S.heap_n];
    if (S.heap_n) { S.heap[0] = last; heap_down(0); }
    t->timed_out = 1;
    if (t->waiter) mg_wake(t->waiter);
  }
  timer_sync();
}

/* ---------------------------------------------------------------- tasks */

static int task_mt_ref = LUA_NOREF;
static const void *task_mt;     /* identity of the metatable, for fast checks */

static mg_task *check_task(lua_State *L, int i) {
  void *p = lua_touserdata(L, i);
  if (p && lua_getmetatable(L, i)) {
    const void *mt = lua_topointer(L, -1);
    lua_pop(L, 1);
    if (mt == task_mt) return (mg_task *)p;
  }
  luaL_typeerror(L, i, "task");
  return NULL;
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

/* Give a coroutine whose function returned back to the pool: its call
** stack is empty and it can start again as is. Failed and cancelled ones go
** to the collector instead: Lua 5.4.4's lua_resetthread does not clear the
** error-handler slot, so one stopped inside an xpcall is unsafe to reuse. */
static void recycle(lua_State *L, lua_State *co) {
  if (lua_gethook(co)) lua_sethook(co, NULL, 0, 0);
  lua_settop(co, 0);
  if (S.pool_n >= POOL_MAX) return;
  if (!S.pool_ref) {
    lua_newtable(L);
    S.pool_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  }
  lua_rawgeti(L, LUA_REGISTRYINDEX, S.pool_ref);
  lua_pushthread(co);
  lua_xmove(co, L, 1);
  lua_rawseti(L, -2, ++S.pool_n);
  lua_pop(L, 1);
}

/* Finish t with the n values on top of t->co as its result (the error
** object when failed or cancelled). The values move into the task's
** userdata (one value as is, several in a table) so the coroutine can be
** reused at once. */
static void finish(lua_State *L, mg_task *t, task_result r, int n) {
  lua_State *co = t->co;
  if (n > 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
    if (n == 1) {
      lua_xmove(co, L, 1);
    } else {
      lua_createtable(L, n, 0);
      for (int i = n; i >= 1; i--) {
        lua_xmove(co, L, 1);
        lua_rawseti(L, -2, i);
      }
    }
    lua_setiuservalue(L, -2, UV_RESULT);
    lua_pop(L, 1);
  }
  t->state = T_DONE;
  t->result = r;
  t->nresults = n;
  t->co = NULL;
  live_remove(t);
  deadline_clear(t);
  t->observed = (r != RES_FAILED) || t->joiners != NULL;
  wake_joiners(t);
  luaL_unref(L, LUA_REGISTRYINDEX, t->self_ref);
  t->self_ref = LUA_NOREF;
  if (r == RES_OK) recycle(L, co);
}

/* Push a done task's error object (task at index i). */
static void push_error(lua_State *L, int i) {
  lua_getiuservalue(L, i, UV_RESULT);
}

static void report_unobserved(lua_State *L, mg_task *t, int i) {
  if (t->state != T_DONE || t->result != RES_FAILED || t->observed) return;
  t->observed = 1;
  push_error(L, i);
  const char *msg = lua_tostring(L, -1);
  fprintf(stderr, "moongraph: a task failed and was never joined:\n%s\n",
          msg ? msg : "(error object is not a string)");
  fflush(stderr);
  lua_pop(L, 1);
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
  mg_watchdog_enter(t->co, t->watch_ns < 0 ? S.watch_default : (uint64_t)t->watch_ns);
  int st = lua_resume(t->co, L, nargs, &nres);
  int stopped = mg_watchdog_leave(t->co);
  S.current = NULL;
  if (st == LUA_YIELD && stopped) {
    /* the watchdog yielded it out of a loop it would not leave */
    lua_resetthread(t->co);
    lua_settop(t->co, 0);
    lua_pushstring(t->co, mg_watchdog_message());
    finish(L, t, RES_FAILED, 1);
    return;
  }
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

static lua_State *new_coroutine(lua_State *L) {
  if (S.pool_n > 0) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, S.pool_ref);
    lua_rawgeti(L, -1, S.pool_n);
    lua_pushnil(L);
    lua_rawseti(L, -3, S.pool_n--);
    lua_remove(L, -2);
    return lua_tothread(L, -1);
  }
  return lua_newthread(L);
}

/* Create a task running the function at stack index fi with the n values
** above it as arguments (all are consumed). Leaves the task on the stack. */
static mg_task *spawn(lua_State *L, int fi, int n) {
  mg_task *t = (mg_task *)lua_newuserdatauv(L, sizeof *t, UV_COUNT);
  memset(t, 0, sizeof *t);
  lua_rawgeti(L, LUA_REGISTRYINDEX, task_mt_ref);
  lua_setmetatable(L, -2);
  t->co = new_coroutine(L);
  lua_setiuservalue(L, -2, UV_CO);
  lua_pushvalue(L, -1);
  t->self_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  lua_rotate(L, fi, 1);         /* task below the function */
  lua_xmove(L, t->co, n + 1);   /* function and arguments */
  t->nargs = n;
  t->observed = 1;
  t->watch_ns = -1;
  if (S.current) {
    t->limit_ns = S.current->limit_ns;
    t->watch_ns = S.current->watch_ns;
  }
  live_add(t);
  enqueue(t);
  return t;
}

static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  mg_loop();
  spawn(L, 1, lua_gettop(L) - 1);
  return 1;
}

/* Push `true, results...` or `false, err` for the done task at index i. */
static int push_results(lua_State *L, mg_task *t, int i) {
  t->observed = 1;
  if (t->result != RES_OK) {
    lua_pushboolean(L, 0);
    push_error(L, i);
    return 2;
  }
  int n = t->nresults;
  luaL_checkstack(L, n + 1, "too many results");
  lua_pushboolean(L, 1);
  if (n == 1) {
    lua_getiuservalue(L, i, UV_RESULT);
  } else if (n > 1) {
    lua_getiuservalue(L, i, UV_RESULT);
    int tbl = lua_gettop(L);
    for (int k = 1; k <= n; k++) lua_rawgeti(L, tbl, k);
    lua_remove(L, tbl);
  }
  return n + 1;
}

static void join_cancel(mg_waiter *w) {
  join_wait *j = (join_wait *)w;
  mg_task *self = TASK_OF(j, join);
  mg_task *t = j->target;
  if (t) {
    if (j->prev) j->prev->next = j->next;
    else t->joiners = j->next;
    if (j->next) j->next->prev = j->prev;
    j->prev = j->next = NULL;
    j->target = NULL;
  }
  deadline_clear(self);
}

static int join_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status; (void)ctx;
  mg_task *t = check_task(L, 1);
  mg_task *self = mg_current(L);
  if (t->state != T_DONE) {       /* woken by the deadline */
    join_cancel(&self->join.w);
    lua_pushboolean(L, 0);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  deadline_clear(self);
  return push_results(L, t, 1);
}

static int l_task_join(lua_State *L) {
  mg_task *t = check_task(L, 1);
  double timeout = luaL_optnumber(L, 2, -1);
  if (t->state == T_DONE) return push_results(L, t, 1);
  mg_task *self = mg_current(L);
  if (self == t) return luaL_error(L, "task:join(): a task cannot join itself");
  mg_check_yieldable(L, "task:join");
  join_wait *j = &self->join;
  j->target = t;
  j->prev = NULL;
  j->next = t->joiners;
  if (t->joiners) t->joiners->prev = j;
  t->joiners = j;
  self->timed_out = 0;
  if (timeout >= 0) deadline_set(L, self, timeout);
  /* Without a deadline, only another task can end this wait, so it does
  ** not count as pending I/O for the deadlock check. */
  return await_(L, &j->w, join_cancel, join_k, 0, timeout >= 0);
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
  report_unobserved(L, t, 1);
  return 0;
}

/* ---------------------------------------------------------------- sleep */

static void sleep_cancel(mg_waiter *w) {
  deadline_clear(TASK_OF(w, sleep_w));
}

static int done_k(lua_State *L, int status, lua_KContext ctx) {
  (void)L; (void)status; (void)ctx;
  return 0;
}

static int l_sleep(lua_State *L) {
  double sec = luaL_checknumber(L, 1);
  luaL_argcheck(L, sec >= 0 && sec == sec, 1, "must be a non-negative number");
  mg_check_yieldable(L, "mg.sleep");
  mg_task *t = mg_current(L);
  if (sec == 0) {
    /* back of the ready queue: every task ready now runs first */
    enqueue(t);
    return lua_yieldk(L, 0, 0, done_k);
  }
  deadline_set(L, t, sec);
  return await_(L, &t->sleep_w, sleep_cancel, done_k, 0, 1);
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

/* ------------------------------------------------------ task deadlines */

#define RESERVE_SHARE 0.1   /* of the time left, kept back for the caller */
#define RESERVE_MAX 1.0     /* seconds */

double mg_call_budget(lua_State *L) {
  mg_task *t = mg_current(L);
  if (!t || !t->limit_ns) return -1;
  uint64_t now = uv_hrtime();
  if (now >= t->limit_ns) return 0;
  double left = (double)(t->limit_ns - now) / 1e9;
  double reserve = left * RESERVE_SHARE;
  if (reserve > RESERVE_MAX) reserve = RESERVE_MAX;
  return left - reserve;
}

/* deadline() -> seconds on the mg.now() clock, or nil: the running task's */
static int l_deadline(lua_State *L) {
  mg_task *t = mg_current(L);
  if (!t || !t->limit_ns) { lua_pushnil(L); return 1; }
  lua_pushnumber(L, (double)t->limit_ns / 1e9);
  return 1;
}

/* budget() -> seconds, or nil: see mg_call_budget */
static int l_budget(lua_State *L) {
  double b = mg_call_budget(L);
  if (b < 0) lua_pushnil(L);
  else lua_pushnumber(L, b);
  return 1;
}

/* limit(task, at) -> task: bound the task's deadline by `at` (seconds on the
** mg.now() clock); a deadline it already has that is earlier stays. */
static int l_limit(lua_State *L) {
  mg_task *t = check_task(L, 1);
  double at = luaL_checknumber(L, 2);
  luaL_argcheck(L, at == at, 2, "must be a number");
  uint64_t ns = at <= 0 ? 1 : (uint64_t)(at * 1e9);
  if (!t->limit_ns || ns < t->limit_ns) t->limit_ns = ns;
  lua_settop(L, 1);
  return 1;
}

/* ------------------------------------------------------------- watchdog */

/* watchdog(sec) -> the previous default: the limit on one resume of every
** task without its own (0 or false: none, the default);
** watchdog(sec, task) -> task: that task's own limit, and of the tasks it
** spawns from then on (0 or false: never stopped; nil: the default).
** See watchdog.c for what happens at the limit. */
static int64_t watch_arg(lua_State *L, int i, int allow_nil) {
  if (allow_nil && lua_isnil(L, i)) return -1;
  if (lua_isboolean(L, i) && !lua_toboolean(L, i)) return 0;
  if (lua_type(L, i) != LUA_TNUMBER) luaL_typeerror(L, i, "number of seconds or false");
  double sec = lua_tonumber(L, i);
  luaL_argcheck(L, sec >= 0 && sec < 1e9, i, "must be a number of seconds >= 0 (or false)");
  return (int64_t)(sec * 1e9);
}

static int l_watchdog(lua_State *L) {
  if (lua_gettop(L) < 2) {
    uint64_t prev = S.watch_default;
    S.watch_default = (uint64_t)watch_arg(L, 1, 0);
    lua_pushnumber(L, (double)prev / 1e9);
    return 1;
  }
  mg_task *t = check_task(L, 2);
  t->watch_ns = watch_arg(L, 1, 1);
  lua_settop(L, 2);
  return 1;
}

/* ------------------------------------------------------------ suspend/wake */

/* suspend([timeout]) stops the running task until another task calls
** wake(task, value), or the timeout passes; it returns (true, value) or
** (nil, "timeout"). The Lua side builds queues and events on it. A suspend
** without timeout can only end by another task, so it does not count as
** pending I/O. */
static void suspend_cancel(mg_waiter *w) {
  deadline_clear(TASK_OF(w, wake_w));
}

static int suspend_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status; (void)ctx;
  mg_task *t = mg_current(L);
  deadline_clear(t);
  if (t->timed_out) {
    lua_pushnil(L);
    lua_pushliteral(L, "timeout");
    return 2;
  }
  lua_pushboolean(L, 1);
  lua_rawgeti(L, LUA_REGISTRYINDEX, t->self_ref);
  lua_getiuservalue(L, -1, UV_WAKE_VALUE);
  lua_pushnil(L);
  lua_setiuservalue(L, -3, UV_WAKE_VALUE);
  lua_remove(L, -2);
  return 2;
}

static int l_suspend(lua_State *L) {
  double timeout = luaL_optnumber(L, 1, -1);
  mg_check_yieldable(L, "suspend");
  mg_task *t = mg_current(L);
  t->timed_out = 0;
  if (timeout >= 0) deadline_set(L, t, timeout);
  return await_(L, &t->wake_w, suspend_cancel, suspend_k, 0, timeout >= 0);
}

static int l_wake(lua_State *L) {
  mg_task *t = check_task(L, 1);
  lua_settop(L, 2);
  if (t->state != T_WAITING || t->waiter != &t->wake_w) {
    lua_pushboolean(L, 0);
    return 1;
  }
  lua_setiuservalue(L, 1, UV_WAKE_VALUE);
  mg_wake(&t->wake_w);
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

static void cancel_all(lua_State *L);

/* Ctrl-C cancels the run's main task; once that has returned (a script
** whose spawned tasks are still running), it cancels all of them. */
static void handle_interrupt(lua_State *L) {
  if (!S.interrupted || S.current != NULL) return;
  S.interrupted = 0;
  if (S.interrupt_target && S.interrupt_target->state != T_DONE) {
    cancel_task(L, S.interrupt_target);
  } else if (S.live) {
    S.interrupted_rest = 1;
    cancel_all(L);
  }
}

/* One turn of the libuv loop; callbacks only mark tasks ready. */
static void turn(uv_run_mode mode) {
  S.in_uv_run = 1;
  uv_run(S.loop, mode);
  S.in_uv_run = 0;
}

/* Run until `until` is done (or, when NULL, until no task can make
** progress). Returns 0, or -1 when `until` can never finish (deadlock). */
static int run_until(lua_State *L, mg_task *until) {
  /* libuv's clock stood still while no run was going: without this, a
  ** timer the first tasks arm (a connect or process timeout) counts from
  ** the end of the previous run and may fire at once */
  uv_update_time(mg_loop());
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
      turn(UV_RUN_NOWAIT);
      continue;
    }
    if (S.io_waiting == 0) return until ? -1 : 0;
    turn(UV_RUN_ONCE);
  }
}

static void cancel_all(lua_State *L) {
  while (S.live) cancel_task(L, S.live);
  uv_run(S.loop, UV_RUN_NOWAIT);  /* let close callbacks free the handles */
}

/* How run_impl treats the tasks still alive when the main one is done. */
enum { RUN_CANCEL_REST, RUN_WAIT_ALL, RUN_KEEP_REST };

/* core.run(fn, ...) -> results of fn, or raises its error; tasks still alive
** afterwards are cancelled. core.run_to_completion waits for every task
** first (the CLI's semantics for scripts); core.run_keeping_tasks leaves them
** suspended for the next run (the REPL: tasks spawned at the prompt live on). */
static int run_impl(lua_State *L, int mode) {
  luaL_checktype(L, 1, LUA_TFUNCTION);
  if (S.running || mg_current(L))
    return luaL_error(L, "mg.run: the loop is already running (inside a "
                         "task, use mg.spawn and task:join instead)");
  S.running = 1;
  int n = lua_gettop(L);
  mg_task *main = spawn(L, 1, n - 1);
  int main_idx = lua_gettop(L);
  mg_task *prev_target = S.interrupt_target;
  S.interrupt_target = main;
  int rc = run_until(L, main);
  S.interrupted_rest = 0;
  if (rc == 0 && mode == RUN_WAIT_ALL) run_until(L, NULL);
  S.interrupt_target = prev_target;
  if (mode != RUN_KEEP_REST) cancel_all(L);
  else uv_run(S.loop, UV_RUN_NOWAIT);
  S.running = 0;
  if (rc < 0) {
    return luaL_error(L, "mg.run: the main task is waiting for something "
                         "that can never happen (no pending I/O or timers)");
  }
  if (S.interrupted_rest) {
    S.interrupted_rest = 0;
    lua_pushliteral(L, "cancelled");
    return lua_error(L);
  }
  int k = push_results(L, main, main_idx);
  if (main->result != RES_OK) return lua_error(L);
  lua_remove(L, -k);              /* drop the `true` */
  return k - 1;
}

static int l_run(lua_State *L) { return run_impl(L, RUN_CANCEL_REST); }
static int l_run_to_completion(lua_State *L) { return run_impl(L, RUN_WAIT_ALL); }
static int l_run_keeping_tasks(lua_State *L) { return run_impl(L, RUN_KEEP_REST); }

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
  {"run_to_completion", l_run_to_completion},
  {"run_keeping_tasks", l_run_keeping_tasks},
  {"running", l_running},
  {"spawn", l_spawn},
  {"sleep", l_sleep},
  {"now", l_now},
  {"current", l_current},
  {"deadline", l_deadline},
  {"budget", l_budget},
  {"limit", l_limit},
  {"watchdog", l_watchdog},
  {"suspend", l_suspend},
  {"wake", l_wake},
  {"install_interrupt", l_install_interrupt},
  {NULL, NULL}
};

int mg_open_loop(lua_State *L) {
  mg_loop();
  mg_register_class(L, TASK_MT, task_methods, l_task_gc, NULL, l_task_tostring);
  luaL_getmetatable(L, TASK_MT);
  task_mt = lua_topointer(L, -1);
  if (task_mt_ref == LUA_NOREF) task_mt_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  else lua_pop(L, 1);
  luaL_newlib(L, loop_funcs);
  return 1;
}
