/*
** mg.h — the runtime's internal C interface.
**
** Every C file of the runtime includes this. It declares the scheduler's
** contract with I/O primitives (the waiter), the loop accessor and the
** entry points of each sub-module that moongraph.core exposes.
**
** How a primitive works (see loop.c for the scheduler side):
**
**   static int op_done(lua_State *L, int status, lua_KContext ctx) {
**     my_op *op = (my_op *)ctx;       -- runs inside the task, may push values
**     ...push results...; free(op); return n;
**   }
**   static void op_cancel(mg_waiter *w) {  -- task cancelled while waiting
**     my_op *op = container_of(w);          -- stop the I/O, free op later
**   }
**   static int l_op(lua_State *L) {
**     mg_check_yieldable(L, "mod.op");      -- before starting any I/O
**     my_op *op = calloc(...); start I/O;   -- callbacks call mg_wake(&op->w)
**     return mg_await(L, &op->w, op_cancel, op_done, (lua_KContext)op);
**   }
**
** Completion callbacks never touch Lua: they store their result in the
** operation and call mg_wake(). The loop later resumes the task, and Lua
** calls the continuation, which pushes the results.
*/
#ifndef MG_H
#define MG_H

#include <lua.h>
#include <lauxlib.h>
#include <uv.h>

#define MG_VERSION "0.1.0"

typedef struct mg_task mg_task;
typedef struct mg_waiter mg_waiter;

/* Called once when the task waiting on w is cancelled (task:cancel(),
** mg.timeout, end of mg.run). It must stop the operation and arrange for its
** memory to be freed (for libuv handles: in the uv_close callback). After it
** returns, mg_wake(w) is a harmless no-op, but w must stay valid until the
** operation's own callbacks stop referring to it. */
typedef void (*mg_cancel_fn)(mg_waiter *w);

struct mg_waiter {
  mg_task *task;        /* waiting task; NULL when idle, woken or cancelled */
  mg_cancel_fn cancel;
};

/* The process-wide libuv loop. */
uv_loop_t *mg_loop(void);

/* Raise a clear Lua error unless the caller runs in a moongraph task at a
** point where it can yield. `what` names the primitive in the message. */
void mg_check_yieldable(lua_State *L, const char *what);

/* Suspend the running task until mg_wake(w). Use as `return mg_await(...)`
** from a lua_CFunction. On wake, k(L, LUA_YIELD, ctx) runs in the task and
** returns the results. If the task cannot yield here, cancel(w) is called and
** a Lua error is raised. */
int mg_await(lua_State *L, mg_waiter *w, mg_cancel_fn cancel,
             lua_KFunction k, lua_KContext ctx);

/* Make w's task ready to run (from any libuv/curl/hiredis callback). Never
** runs Lua. Does nothing when w is not armed (already woken or cancelled). */
void mg_wake(mg_waiter *w);

/* The running task's state, or NULL when L is not a moongraph task. */
mg_task *mg_current(lua_State *L);

/* Deadlines propagate: a task with a deadline (mg.timeout, inherited by the
** tasks it spawns) bounds every call it makes. A primitive that starts I/O
** takes min(its own timeout, mg_call_budget(L)) as its time limit: the
** seconds left before the deadline less a reserve (a tenth of what is left,
** at most 1 s) that leaves the caller time to handle the failure, e.g. take
** a fallback. Returns -1 when the task has no deadline, 0 when none is left. */
double mg_call_budget(lua_State *L);

/* Sub-modules of moongraph.core: each pushes one table. */
int mg_open_loop(lua_State *L);
int mg_open_sse(lua_State *L);
int mg_open_http(lua_State *L);
int mg_open_redis(lua_State *L);
int mg_open_pg(lua_State *L);
int mg_open_files(lua_State *L);
int mg_open_json(lua_State *L);
int mg_open_pack(lua_State *L);
int mg_open_bytes(lua_State *L);
int mg_open_codepoints(lua_State *L);
int mg_open_sentences(lua_State *L);
int mg_open_signal(lua_State *L);
int mg_open_process(lua_State *L);
int mg_open_server(lua_State *L);
int mg_open_errors(lua_State *L);

/* Errors as values (errors.c): mg_error_new replaces the message on top of
** the stack with an error { code, message, retryable }; mg_error_detail
** pops a value into err.details[key] (the error just below it);
** mg_push_error pushes nil and a new error (return its 2). */
void mg_error_new(lua_State *L, const char *code, int retryable);
void mg_error_detail(lua_State *L, const char *key);
int mg_push_error(lua_State *L, const char *code, int retryable, const char *message);
/* code, retryable of the failures a client itself sees: a server away or
** lost, a call over its time */
#define MG_UNAVAILABLE "unavailable", 1
#define MG_TIMEOUT "timeout", 1

/* Create the metatable `name` (once): __index is a table of `methods`, and
** each non-NULL function becomes __gc, __close or __tostring. Leaves the
** stack as it was. */
void mg_register_class(lua_State *L, const char *name, const luaL_Reg *methods,
                       lua_CFunction gc, lua_CFunction close,
                       lua_CFunction tostring);

/* The watchdog (watchdog.c). The scheduler brackets every resume of a task:
** enter with the task's coroutine and its limit in ns (0: not watched),
** leave once lua_resume returned; leave returns 1 when the watchdog stopped
** that resume for good (lua_resume gave LUA_YIELD): the task must end as
** failed with mg_watchdog_message(). signal.c tells it which stop signals
** the process waits for, and when the loop has handled one. */
void mg_watchdog_enter(lua_State *co, uint64_t limit_ns);
int mg_watchdog_leave(lua_State *co);
const char *mg_watchdog_message(void);
void mg_watchdog_signal(int signum);
void mg_watchdog_signal_seen(int signum);

/* SIGINT while Lua runs: the REPL and CLI install this (see loop.c). */
void mg_install_interrupt(lua_State *L);

int luaopen_moongraph_core(lua_State *L);

#endif
