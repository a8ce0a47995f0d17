/*
** process.c — child processes on the loop (libuv uv_spawn).
**
** Owns every child the runtime starts: its uv_process_t, its three pipes,
** the timer that enforces a time limit and the SIGTERM -> SIGKILL grace, and
** the tasks waiting to read, write or see it exit.
**
**   core.process.spawn(opts) -> proc | nil, err        never yields
**     opts: args = {file, arg1, ...} (no shell; file is looked up in the
**     child's PATH), env = {NAME = value, ...} (the whole environment; nil
**     inherits ours), cwd, stdin/stdout/stderr = "pipe" (default) |
**     "inherit" | "null", timeout (seconds; then TERM, then KILL after the
**     grace), kill_grace (seconds, default 2), max_line (bytes, default 16 MiB)
**   proc:read(fd, what) -> string | nil (end of stream) | nil, err   yields
**     fd 1 (stdout) or 2 (stderr); what: "l" a line without its "\n", "L"
**     with it, "a" everything up to the end, or n: between 1 and n bytes
**   proc:write(data) -> true | nil, err     yields while the pipe is full
**   proc:close_stdin()                      the child reads end of file
**   proc:wait() -> code, signal_name|nil    yields until the child exits;
**     code is the exit status, or 128 + the signal number
**   proc:kill([sig]) -> true | nil, err     one signal (name or number)
**   proc:terminate([grace]) -> true | nil, err    TERM, then KILL after grace
**   proc:pid() proc:exited() proc:timed_out()
**   proc:close()                            terminate and close the pipes
**   core.process.environ() -> {NAME = value}   our own environment
**
** Lifetimes: a proc is malloc'ed apart from its Lua userdata, because libuv
** owns its handles until their close callbacks run. It is freed once the
** userdata is gone (collected or closed), the child has been reaped and every
** handle is closed. A child whose userdata is collected while it runs gets
** the terminate sequence. At process exit (atexit, or when core.so is
** unloaded) every child still alive is sent SIGTERM, given its grace, sent
** SIGKILL and reaped, so no child outlives the runtime that started it.
** Only SIGKILL of the runtime itself escapes this (the kernel gives no hook).
**
** Reads: each pipe buffers what the child wrote; reading stops while more
** than HIGH_WATER bytes wait and no task wants more, so a child that writes
** faster than it is read blocks on its pipe instead of filling our memory.
** One task at a time reads a given pipe; writes from several tasks go out in
** call order.
*/
#include "mg.h"

#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

#define PROC_MT "moongraph.process"
#define HIGH_WATER (256 * 1024)
#define DEFAULT_MAX_LINE (16 * 1024 * 1024)
#define DEFAULT_GRACE_MS 2000

typedef struct proc proc;

typedef struct {
  char *p;
  size_t start, len, cap;   /* unread bytes are p[start .. start+len) */
} rbuf;

typedef struct {
  uv_pipe_t pipe;
  proc *owner;
  int used;        /* "pipe" was asked for: the handle was initialised */
  int closed;      /* uv_close called */
  int reading;     /* uv_read_start active */
  int eof;
  int err;         /* libuv error code of the last read, 0 = none */
  rbuf buf;
  mg_waiter rw;    /* the one task reading this pipe */
} pipe_end;

typedef struct write_op {
  mg_waiter w;
  uv_write_t req;
  int status;
  int done;
  int abandoned;   /* the task went away: free in the callback */
  size_t len;
  char data[];
} write_op;

typedef struct wait_op {
  mg_waiter w;
  proc *p;
  struct wait_op *prev, *next;
} wait_op;

struct proc {
  uv_process_t h;
  uv_timer_t timer;
  pipe_end io[3];
  int pid;
  int exited;
  int64_t exit_status;
  int term_signal;
  int timed_out;
  int terminating;       /* SIGTERM sent, SIGKILL armed */
  int killed_hard;
  int ud_alive;          /* the Lua userdata still points here */
  int is_self;           /* our own stdin/stdout (core.process.stdio) */
  int open_handles;      /* handles whose close callback has not run */
  uint64_t limit_ms;     /* time limit, 0 = none */
  uint64_t grace_ms;
  size_t max_line;
  wait_op *waiters;
  proc *prev_live, *next_live;
};

typedef struct { proc *p; } proc_ud;

static proc *live;          /* children not yet reaped */
static int atexit_installed;

/* ------------------------------------------------------------ signals */

static const struct { const char *name; int num; } SIGNALS[] = {
  {"TERM", SIGTERM}, {"KILL", SIGKILL}, {"INT", SIGINT}, {"HUP", SIGHUP},
  {"QUIT", SIGQUIT}, {"USR1", SIGUSR1}, {"USR2", SIGUSR2}, {"STOP", SIGSTOP},
  {"CONT", SIGCONT}, {"PIPE", SIGPIPE}, {"ALRM", SIGALRM}, {"ABRT", SIGABRT},
  {"SEGV", SIGSEGV}, {"BUS", SIGBUS}, {"FPE", SIGFPE}, {"ILL", SIGILL},
  {"TRAP", SIGTRAP}, {"SYS", SIGSYS}, {"XCPU", SIGXCPU}, {"XFSZ", SIGXFSZ},
  {"WINCH", SIGWINCH}, {"CHLD", SIGCHLD},
};

static const char *signal_name(int num) {
  for (size_t i = 0; i < sizeof SIGNALS / sizeof SIGNALS[0]; i++)
    if (SIGNALS[i].num == num) return SIGNALS[i].name;
  return NULL;
}

static int check_signal(lua_State *L, int i) {
  if (lua_isnoneornil(L, i)) return SIGTERM;
  if (lua_type(L, i) == LUA_TNUMBER) {
    lua_Integer n = luaL_checkinteger(L, i);
    luaL_argcheck(L, n > 0 && n < 65, i, "not a signal number");
    return (int)n;
  }
  const char *s = luaL_checkstring(L, i);
  if (!strncmp(s, "SIG", 3)) s += 3;
  for (size_t k = 0; k < sizeof SIGNALS / sizeof SIGNALS[0]; k++)
    if (!strcmp(SIGNALS[k].name, s)) return SIGNALS[k].num;
  return luaL_argerror(L, i, lua_pushfstring(L, "unknown signal '%s'", s));
}

/* ------------------------------------------------------------ lifetime */

static void live_remove(proc *p) {
  if (p->prev_live) p->prev_live->next_live = p->next_live;
  else if (live == p) live = p->next_live;
  if (p->next_live) p->next_live->prev_live = p->prev_live;
  p->prev_live = p->next_live = NULL;
}

static void maybe_free(proc *p) {
  if (p->ud_alive || p->open_handles > 0 || !p->exited) return;
  for (int i = 0; i < 3; i++) free(p->io[i].buf.p);
  free(p);
}

static void on_handle_closed(uv_handle_t *h) {
  proc *p = (proc *)h->data;
  p->open_handles--;
  maybe_free(p);
}

static void on_pipe_closed(uv_handle_t *h) {
  proc *p = ((pipe_end *)h->data)->owner;
  p->open_handles--;
  maybe_free(p);
}

/* The process handle and the timer carry the proc in their data. */
static void close_handle(uv_handle_t *h) {
  if (!uv_is_closing(h)) uv_close(h, on_handle_closed);
}

static void pipe_close(pipe_end *pe) {
  if (!pe->used || pe->closed) return;
  pe->closed = 1;
  pe->reading = 0;
  uv_close((uv_handle_t *)&pe->pipe, on_pipe_closed);
  mg_wake(&pe->rw);      /* a waiting reader sees the stream closed */
}

static void send_signal(proc *p, int sig) {
  if (!p->exited) uv_process_kill(&p->h, sig);
}

static void on_timer(uv_timer_t *t);

/* TERM now, KILL after the grace unless the child is gone by then. */
static void start_terminate(proc *p) {
  if (p->exited || p->terminating) return;
  p->terminating = 1;
  send_signal(p, SIGTERM);
  uv_timer_start(&p->timer, on_timer, p->grace_ms, 0);
}

static void on_timer(uv_timer_t *t) {
  proc *p = (proc *)t->data;
  if (p->exited) return;
  if (!p->terminating) {          /* the time limit */
    p->timed_out = 1;
    start_terminate(p);
    return;
  }
  p->killed_hard = 1;
  send_signal(p, SIGKILL);
}

static void on_child_exit(uv_process_t *h, int64_t status, int term_signal) {
  proc *p = (proc *)h->data;
  p->exited = 1;
  p->exit_status = status;
  p->term_signal = term_signal;
  live_remove(p);
  uv_timer_stop(&p->timer);
  close_handle((uv_handle_t *)&p->h);
  close_handle((uv_handle_t *)&p->timer);
  while (p->waiters) {
    wait_op *op = p->waiters;
    p->waiters = op->next;
    op->prev = op->next = NULL;
    op->p = NULL;
    mg_wake(&op->w);
  }
}

/* At exit: children still running get TERM, their grace, then KILL, and
** are reaped. libuv is not running any more, so waitpid is ours. */
static void reap_all_at_exit(void) {
  if (!live) return;
  uint64_t grace = 0;
  for (proc *p = live; p; p = p->next_live) {
    if (p->grace_ms > grace) grace = p->grace_ms;
    if (!p->terminating && !p->killed_hard) kill(p->pid, SIGTERM);
  }
  struct timespec nap = {0, 5 * 1000 * 1000};
  uint64_t waited = 0;
  for (;;) {
    int left = 0;
    for (proc *p = live; p; p = p->next_live) {
      if (p->exited) continue;
      int st;
      pid_t r = waitpid(p->pid, &st, WNOHANG);
      if (r == p->pid || (r < 0 && errno == ECHILD)) p->exited = 1;
      else left++;
    }
    if (!left || waited >= grace) break;
    nanosleep(&nap, NULL);
    waited += 5;
  }
  for (proc *p = live; p; p = p->next_live) {
    if (p->exited) continue;
    kill(p->pid, SIGKILL);
    int st;
    while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR) {}
    p->exited = 1;
  }
  live = NULL;
}

/* ------------------------------------------------------------ reading */

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *b) {
  pipe_end *pe = (pipe_end *)h->data;
  rbuf *rb = &pe->buf;
  if (suggested < 65536) suggested = 65536;
  if (rb->start > 0 && (rb->start > rb->cap / 2 || rb->start + rb->len + suggested > rb->cap)) {
    memmove(rb->p, rb->p + rb->start, rb->len);
    rb->start = 0;
  }
  if (rb->start + rb->len + suggested > rb->cap) {
    size_t cap = rb->cap ? rb->cap : 65536;
    while (cap < rb->start + rb->len + suggested) cap *= 2;
    char *n = realloc(rb->p, cap);
    if (!n) { b->base = NULL; b->len = 0; return; }
    rb->p = n;
    rb->cap = cap;
  }
  b->base = rb->p + rb->start + rb->len;
  b->len = rb->cap - rb->start - rb->len;
}

static void update_reading(pipe_end *pe);

static void on_read(uv_stream_t *s, ssize_t n, const uv_buf_t *b) {
  pipe_end *pe = (pipe_end *)s->data;
  (void)b;
  if (n > 0) {
    pe->buf.len += (size_t)n;
  } else if (n == UV_EOF) {
    pe->eof = 1;
  } else if (n < 0) {
    pe->err = (int)n;
    pe->eof = 1;
  }
  if (pe->eof && pe->reading) {
    uv_read_stop(s);
    pe->reading = 0;
  }
  mg_wake(&pe->rw);
  update_reading(pe);
}

/* A task is about to wait for more bytes: read whatever is buffered. */
static void start_reading(pipe_end *pe) {
  if (!pe->used || pe->closed || pe->eof || pe->reading) return;
  if (uv_read_start((uv_stream_t *)&pe->pipe, on_alloc, on_read) == 0) pe->reading = 1;
}

/* Read while little is buffered or a task waits for more. */
static void update_reading(pipe_end *pe) {
  if (!pe->used || pe->closed || pe->eof) return;
  int want = pe->buf.len < HIGH_WATER || pe->rw.task != NULL;
  if (want && !pe->reading) {
    if (uv_read_start((uv_stream_t *)&pe->pipe, on_alloc, on_read) == 0) pe->reading = 1;
  } else if (!want && pe->reading) {
    uv_read_stop((uv_stream_t *)&pe->pipe);
    pe->reading = 0;
  }
}

/* How a read is asked for: mode 'l', 'L', 'a', or 'n' with a count. */
typedef struct { char mode; size_t n; } read_req;

static void take(lua_State *L, pipe_end *pe, size_t n, size_t drop) {
  lua_pushlstring(L, pe->buf.p + pe->buf.start, n);
  pe->buf.start += n + drop;
  pe->buf.len -= n + drop;
  if (pe->buf.len == 0) pe->buf.start = 0;
}

/* Push the result when the request can be answered now; 0 when it must
** wait for more bytes. */
static int read_result(lua_State *L, pipe_end *pe, read_req rq, size_t max_line) {
  rbuf *rb = &pe->buf;
  if (pe->closed) {
    luaL_pushfail(L);
    lua_pushliteral(L, "the stream is closed");
    return 2;
  }
  switch (rq.mode) {
    case 'l': case 'L': {
      char *nl = rb->len ? memchr(rb->p + rb->start, '\n', rb->len) : NULL;
      if (nl) {
        size_t n = (size_t)(nl - (rb->p + rb->start));
        if (rq.mode == 'L') take(L, pe, n + 1, 0);
        else take(L, pe, n, 1);
        return 1;
      }
      if (rb->len > max_line) {
        luaL_pushfail(L);
        lua_pushfstring(L, "line longer than %I bytes", (lua_Integer)max_line);
        return 2;
      }
      if (!pe->eof) return 0;
      if (rb->len) { take(L, pe, rb->len, 0); return 1; }
      break;
    }
    case 'a':
      if (!pe->eof) return 0;
      take(L, pe, rb->len, 0);
      return 1;
    default:
      if (rb->len) { take(L, pe, rb->len < rq.n ? rb->len : rq.n, 0); return 1; }
      if (!pe->eof) return 0;
  }
  if (pe->err) {
    luaL_pushfail(L);
    lua_pushfstring(L, "read error: %s", uv_strerror(pe->err));
    return 2;
  }
  luaL_pushfail(L);
  return 1;
}

static proc *check_proc(lua_State *L) {
  proc_ud *u = (proc_ud *)luaL_checkudata(L, 1, PROC_MT);
  if (!u->p) luaL_error(L, "process is closed");
  return u->p;
}

static proc *check_child(lua_State *L) {
  proc *p = check_proc(L);
  if (p->is_self) luaL_error(L, "this is the runtime's own stdio, not a child process");
  return p;
}

static pipe_end *check_pipe(lua_State *L, proc *p, int i) {
  lua_Integer fd = luaL_checkinteger(L, i);
  luaL_argcheck(L, fd == 1 || fd == 2, i, "1 (stdout) or 2 (stderr) expected");
  pipe_end *pe = &p->io[fd];
  if (!pe->used)
    luaL_error(L, "%s was not opened as a pipe (spawn with %s = \"pipe\")",
               fd == 1 ? "stdout" : "stderr", fd == 1 ? "stdout" : "stderr");
  return pe;
}

static void read_cancel(mg_waiter *w) {
  pipe_end *pe = (pipe_end *)((char *)w - offsetof(pipe_end, rw));
  update_reading(pe);
}

static int read_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  proc_ud *u = (proc_ud *)lua_touserdata(L, 1);
  read_req rq;
  rq.mode = (char)(ctx & 0xff);
  rq.n = (size_t)(ctx >> 8);
  if (!u->p) { luaL_pushfail(L); lua_pushliteral(L, "process is closed"); return 2; }
  pipe_end *pe = &u->p->io[lua_tointeger(L, 2)];
  int n = read_result(L, pe, rq, u->p->max_line);
  if (n) { update_reading(pe); return n; }
  start_reading(pe);
  return mg_await(L, &pe->rw, read_cancel, read_k, ctx);
}

static int l_read(lua_State *L) {
  proc *p = check_proc(L);
  pipe_end *pe = check_pipe(L, p, 2);
  read_req rq = {'n', 0};
  if (lua_type(L, 3) == LUA_TNUMBER) {
    lua_Integer n = luaL_checkinteger(L, 3);
    luaL_argcheck(L, n > 0 && n < ((lua_Integer)1 << 40), 3, "byte count must be > 0");
    rq.n = (size_t)n;
  } else {
    const char *m = luaL_checkstring(L, 3);
    if (*m == '*') m++;
    if (*m != 'l' && *m != 'L' && *m != 'a') return luaL_argerror(L, 3, "\"l\", \"L\", \"a\" or a byte count expected");
    rq.mode = *m;
  }
  lua_settop(L, 2);
  int n = read_result(L, pe, rq, p->max_line);
  if (n) { update_reading(pe); return n; }
  if (pe->rw.task)
    return luaL_error(L, "another task is already reading this process's %s",
                      pe == &p->io[1] ? "stdout" : "stderr");
  mg_check_yieldable(L, "process:read");
  lua_KContext ctx = (lua_KContext)(((intptr_t)rq.n << 8) | (unsigned char)rq.mode);
  start_reading(pe);
  return mg_await(L, &pe->rw, read_cancel, read_k, ctx);
}

/* ------------------------------------------------------------ writing */

static void on_write(uv_write_t *req, int status) {
  write_op *op = (write_op *)req->data;
  if (op->abandoned) { free(op); return; }
  op->status = status;
  op->done = 1;
  mg_wake(&op->w);
}

static void write_cancel(mg_waiter *w) {
  write_op *op = (write_op *)w;
  if (op->done) free(op);
  else op->abandoned = 1;
}

static int write_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  write_op *op = (write_op *)ctx;
  int st = op->status;
  free(op);
  if (st < 0) {
    luaL_pushfail(L);
    if (st == UV_EPIPE) lua_pushliteral(L, "broken pipe: the process closed its stdin");
    else if (st == UV_ECANCELED) lua_pushliteral(L, "stdin was closed before the write finished");
    else lua_pushfstring(L, "write error: %s", uv_strerror(st));
    return 2;
  }
  lua_pushboolean(L, 1);
  return 1;
}

static int l_write(lua_State *L) {
  proc *p = check_proc(L);
  size_t len;
  const char *s = luaL_checklstring(L, 2, &len);
  pipe_end *pe = &p->io[0];
  if (!pe->used) return luaL_error(L, "stdin was not opened as a pipe (spawn with stdin = \"pipe\")");
  if (pe->closed) { luaL_pushfail(L); lua_pushliteral(L, "stdin is closed"); return 2; }
  if (len == 0) { lua_pushboolean(L, 1); return 1; }
  uv_buf_t b = uv_buf_init((char *)s, (unsigned)len);
  size_t off = 0;
  int n = uv_try_write((uv_stream_t *)&pe->pipe, &b, 1);
  if (n > 0) off = (size_t)n;
  else if (n != UV_EAGAIN) {
    luaL_pushfail(L);
    if (n == UV_EPIPE) lua_pushliteral(L, "broken pipe: the process closed its stdin");
    else lua_pushfstring(L, "write error: %s", uv_strerror(n));
    return 2;
  }
  if (off == len) { lua_pushboolean(L, 1); return 1; }
  mg_check_yieldable(L, "process:write");
  write_op *op = (write_op *)malloc(sizeof *op + (len - off));
  if (!op) return luaL_error(L, "out of memory");
  memset(op, 0, sizeof *op);
  op->len = len - off;
  memcpy(op->data, s + off, op->len);
  op->req.data = op;
  uv_buf_t rest = uv_buf_init(op->data, (unsigned)op->len);
  int rc = uv_write(&op->req, (uv_stream_t *)&pe->pipe, &rest, 1, on_write);
  if (rc < 0) {
    free(op);
    luaL_pushfail(L);
    lua_pushfstring(L, "write error: %s", uv_strerror(rc));
    return 2;
  }
  return mg_await(L, &op->w, write_cancel, write_k, (lua_KContext)op);
}

static int l_close_stdin(lua_State *L) {
  proc *p = check_proc(L);
  pipe_close(&p->io[0]);
  return 0;
}

/* ------------------------------------------------------------ waiting */

static void push_exit(lua_State *L, proc *p) {
  if (p->term_signal) {
    lua_pushinteger(L, 128 + p->term_signal);
    const char *name = signal_name(p->term_signal);
    if (name) lua_pushstring(L, name);
    else lua_pushfstring(L, "%d", p->term_signal);
  } else {
    lua_pushinteger(L, (lua_Integer)p->exit_status);
    lua_pushnil(L);
  }
}

static void wait_unlink(wait_op *op) {
  proc *p = op->p;
  if (!p) return;
  if (op->prev) op->prev->next = op->next;
  else p->waiters = op->next;
  if (op->next) op->next->prev = op->prev;
  op->prev = op->next = NULL;
  op->p = NULL;
}

static void wait_cancel(mg_waiter *w) {
  wait_op *op = (wait_op *)w;
  wait_unlink(op);
  free(op);
}

static int wait_k(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  free((wait_op *)ctx);
  proc_ud *u = (proc_ud *)lua_touserdata(L, 1);
  if (!u->p) { luaL_pushfail(L); lua_pushliteral(L, "process is closed"); return 2; }
  push_exit(L, u->p);
  return 2;
}

static int l_wait(lua_State *L) {
  proc *p = check_child(L);
  lua_settop(L, 1);
  if (p->exited) { push_exit(L, p); return 2; }
  mg_check_yieldable(L, "process:wait");
  wait_op *op = (wait_op *)calloc(1, sizeof *op);
  if (!op) return luaL_error(L, "out of memory");
  op->p = p;
  op->next = p->waiters;
  if (p->waiters) p->waiters->prev = op;
  p->waiters = op;
  return mg_await(L, &op->w, wait_cancel, wait_k, (lua_KContext)op);
}

/* ------------------------------------------------------------ control */

static int l_kill(lua_State *L) {
  proc *p = check_child(L);
  int sig = check_signal(L, 2);
  if (p->exited) { luaL_pushfail(L); lua_pushliteral(L, "the process has exited"); return 2; }
  int rc = uv_process_kill(&p->h, sig);
  if (rc < 0) { luaL_pushfail(L); lua_pushfstring(L, "kill: %s", uv_strerror(rc)); return 2; }
  if (sig == SIGKILL) p->killed_hard = 1;
  lua_pushboolean(L, 1);
  return 1;
}

static uint64_t check_ms(lua_State *L, int i, const char *what) {
  lua_Number s = luaL_checknumber(L, i);
  if (!(s >= 0) || s > 1e9) luaL_argerror(L, i, lua_pushfstring(L, "%s must be a number of seconds >= 0", what));
  return (uint64_t)(s * 1000 + 0.5);
}

static int l_terminate(lua_State *L) {
  proc *p = check_child(L);
  if (!lua_isnoneornil(L, 2)) p->grace_ms = check_ms(L, 2, "grace");
  if (p->exited) { luaL_pushfail(L); lua_pushliteral(L, "the process has exited"); return 2; }
  start_terminate(p);
  lua_pushboolean(L, 1);
  return 1;
}

static int l_pid(lua_State *L) {
  lua_pushinteger(L, check_child(L)->pid);
  return 1;
}

static int l_exited(lua_State *L) {
  lua_pushboolean(L, check_proc(L)->exited);
  return 1;
}

static int l_timed_out(lua_State *L) {
  lua_pushboolean(L, check_proc(L)->timed_out);
  return 1;
}

/* Give the proc up from the Lua side: a running child gets the terminate
** sequence, the pipes close, and the memory goes once libuv is done. */
static void release(proc_ud *u) {
  proc *p = u->p;
  if (!p) return;
  u->p = NULL;
  p->ud_alive = 0;
  start_terminate(p);
  for (int i = 0; i < 3; i++) pipe_close(&p->io[i]);
  maybe_free(p);
}

static int l_close(lua_State *L) {
  proc_ud *u = (proc_ud *)luaL_checkudata(L, 1, PROC_MT);
  release(u);
  return 0;
}

static int l_gc(lua_State *L) {
  release((proc_ud *)lua_touserdata(L, 1));
  return 0;
}

static int l_tostring(lua_State *L) {
  proc_ud *u = (proc_ud *)luaL_checkudata(L, 1, PROC_MT);
  if (!u->p) lua_pushliteral(L, "process (closed)");
  else lua_pushfstring(L, "process %d (%s)", u->p->pid, u->p->exited ? "exited" : "running");
  return 1;
}

/* ------------------------------------------------------------ spawning */

typedef struct {
  char **args;
  char **env;
  int nargs, nenv;
} spawn_strings;

static void strings_free(spawn_strings *s) {
  if (s->args) for (int i = 0; i < s->nargs; i++) free(s->args[i]);
  if (s->env) for (int i = 0; i < s->nenv; i++) free(s->env[i]);
  free(s->args);
  free(s->env);
}

static int stdio_mode(lua_State *L, const char *field) {
  int t = lua_getfield(L, 1, field);
  int mode = 0;   /* 0 pipe, 1 inherit, 2 null */
  if (t != LUA_TNIL) {
    const char *m = lua_tostring(L, -1);
    if (t != LUA_TSTRING) m = "";
    if (!strcmp(m, "pipe")) mode = 0;
    else if (!strcmp(m, "inherit")) mode = 1;
    else if (!strcmp(m, "null")) mode = 2;
    else luaL_error(L, "bad argument #1 to 'spawn' (%s must be \"pipe\", \"inherit\" or \"null\")", field);
  }
  lua_pop(L, 1);
  return mode;
}

static uint64_t opt_ms(lua_State *L, const char *field, uint64_t dflt) {
  uint64_t ms = dflt;
  if (lua_getfield(L, 1, field) != LUA_TNIL) {
    if (!lua_isnumber(L, -1) || !(lua_tonumber(L, -1) >= 0))
      luaL_error(L, "bad argument #1 to 'spawn' (%s must be a number of seconds >= 0)", field);
    ms = (uint64_t)(lua_tonumber(L, -1) * 1000 + 0.5);
  }
  lua_pop(L, 1);
  return ms;
}

static void ignore_sigpipe(void) {
  struct sigaction sa;
  if (sigaction(SIGPIPE, NULL, &sa) == 0 && sa.sa_handler == SIG_DFL) {
    sa.sa_handler = SIG_IGN;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = 0;
    sigaction(SIGPIPE, &sa, NULL);
  }
}

static int l_spawn(lua_State *L) {
  luaL_checktype(L, 1, LUA_TTABLE);
  lua_settop(L, 1);
  spawn_strings ss = {0};

  /* everything that can raise is read before anything is allocated */
  if (lua_getfield(L, 1, "args") != LUA_TTABLE)
    return luaL_error(L, "bad argument #1 to 'spawn' (args must be a list {program, arg, ...})");
  int nargs = (int)luaL_len(L, -1);
  if (nargs < 1) return luaL_error(L, "bad argument #1 to 'spawn' (args is empty: name the program)");
  for (int i = 1; i <= nargs; i++) {
    if (lua_rawgeti(L, -1, i) != LUA_TSTRING)
      return luaL_error(L, "bad argument #1 to 'spawn' (args[%d] must be a string)", i);
    size_t n;
    const char *s = lua_tolstring(L, -1, &n);
    if (strlen(s) != n) return luaL_error(L, "bad argument #1 to 'spawn' (args[%d] contains a zero byte)", i);
    if (i == 1 && n == 0) return luaL_error(L, "bad argument #1 to 'spawn' (args[1] is empty)");
    lua_pop(L, 1);
  }
  int args_idx = lua_gettop(L);
  int et = lua_getfield(L, 1, "env");
  int env_idx = lua_gettop(L);
  int nenv = 0;
  if (et == LUA_TTABLE) {
    lua_pushnil(L);
    while (lua_next(L, env_idx)) {
      if (lua_type(L, -2) != LUA_TSTRING || (lua_type(L, -1) != LUA_TSTRING && lua_type(L, -1) != LUA_TNUMBER))
        return luaL_error(L, "bad argument #1 to 'spawn' (env must map names to strings)");
      const char *k = lua_tostring(L, -2);
      if (!*k || strchr(k, '=')) return luaL_error(L, "bad argument #1 to 'spawn' (env name '%s' is not valid)", k);
      nenv++;
      lua_pop(L, 1);
    }
  } else if (et != LUA_TNIL) {
    return luaL_error(L, "bad argument #1 to 'spawn' (env must be a table)");
  }
  int ct = lua_getfield(L, 1, "cwd");
  if (ct != LUA_TNIL && ct != LUA_TSTRING)
    return luaL_error(L, "bad argument #1 to 'spawn' (cwd must be a string)");
  const char *cwd = lua_tostring(L, -1);
  int modes[3] = {stdio_mode(L, "stdin"), stdio_mode(L, "stdout"), stdio_mode(L, "stderr")};
  uint64_t limit = opt_ms(L, "timeout", 0);
  uint64_t grace = opt_ms(L, "kill_grace", DEFAULT_GRACE_MS);
  size_t max_line = DEFAULT_MAX_LINE;
  if (lua_getfield(L, 1, "max_line") != LUA_TNIL) {
    if (!lua_isinteger(L, -1) || lua_tointeger(L, -1) < 1)
      return luaL_error(L, "bad argument #1 to 'spawn' (max_line must be an integer > 0)");
    max_line = (size_t)lua_tointeger(L, -1);
  }
  lua_pop(L, 1);

  proc_ud *u = (proc_ud *)lua_newuserdatauv(L, sizeof *u, 0);
  u->p = NULL;
  luaL_setmetatable(L, PROC_MT);
  int ud_idx = lua_gettop(L);

  ss.args = (char **)calloc((size_t)nargs + 1, sizeof(char *));
  ss.nargs = nargs;
  if (!ss.args) goto oom;
  for (int i = 1; i <= nargs; i++) {
    lua_rawgeti(L, args_idx, i);
    ss.args[i - 1] = strdup(lua_tostring(L, -1));
    lua_pop(L, 1);
    if (!ss.args[i - 1]) goto oom;
  }
  if (et == LUA_TTABLE) {
    ss.env = (char **)calloc((size_t)nenv + 1, sizeof(char *));
    if (!ss.env) goto oom;
    lua_pushnil(L);
    int i = 0;
    while (lua_next(L, env_idx)) {
      size_t kl, vl;
      const char *k = lua_tolstring(L, -2, &kl);
      lua_pushvalue(L, -1);
      const char *v = lua_tolstring(L, -1, &vl);
      char *e = (char *)malloc(kl + vl + 2);
      if (!e) { lua_pop(L, 3); goto oom; }
      memcpy(e, k, kl);
      e[kl] = '=';
      memcpy(e + kl + 1, v, vl + 1);
      ss.env[i++] = e;
      ss.nenv = i;
      lua_pop(L, 2);
    }
  }

  proc *p = (proc *)calloc(1, sizeof *p);
  if (!p) goto oom;
  p->grace_ms = grace;
  p->limit_ms = limit;
  p->max_line = max_line;
  p->h.data = p;
  p->timer.data = p;

  uv_loop_t *loop = mg_loop();
  ignore_sigpipe();
  uv_stdio_container_t stdio[3];
  for (int i = 0; i < 3; i++) {
    pipe_end *pe = &p->io[i];
    pe->owner = p;
    if (modes[i] == 0) {
      uv_pipe_init(loop, &pe->pipe, 0);
      pe->pipe.data = pe;
      pe->used = 1;
      stdio[i].flags = UV_CREATE_PIPE | (i == 0 ? UV_READABLE_PIPE : UV_WRITABLE_PIPE);
      stdio[i].data.stream = (uv_stream_t *)&pe->pipe;
    } else if (modes[i] == 1) {
      stdio[i].flags = UV_INHERIT_FD;
      stdio[i].data.fd = i;
    } else {
      stdio[i].flags = UV_IGNORE;
    }
  }
  uv_process_options_t o;
  memset(&o, 0, sizeof o);
  o.exit_cb = on_child_exit;
  o.file = ss.args[0];
  o.args = ss.args;
  o.env = ss.env;
  o.cwd = cwd;
  o.stdio_count = 3;
  o.stdio = stdio;
  int rc = uv_spawn(loop, &p->h, &o);
  uv_timer_init(loop, &p->timer);
  p->open_handles = 1;                  /* the timer */
  for (int i = 0; i < 3; i++) if (p->io[i].used) p->open_handles++;
  if (rc < 0) {
    /* libuv wants the process handle closed even when the spawn failed */
    p->exited = 1;
    p->open_handles++;
    close_handle((uv_handle_t *)&p->h);
    close_handle((uv_handle_t *)&p->timer);
    for (int i = 0; i < 3; i++) pipe_close(&p->io[i]);
    strings_free(&ss);
    lua_rawgeti(L, args_idx, 1);
    const char *file = lua_tostring(L, -1);
    luaL_pushfail(L);
    if (rc == UV_ENOENT && cwd)
      lua_pushfstring(L, "cannot run '%s' in '%s': no such program or directory", file, cwd);
    else if (rc == UV_ENOENT)
      lua_pushfstring(L, "cannot run '%s': no such program%s", file, strchr(file, '/') ? "" : " in PATH");
    else if (rc == UV_EACCES)
      lua_pushfstring(L, "cannot run '%s': permission denied", file);
    else
      lua_pushfstring(L, "cannot run '%s': %s", file, uv_strerror(rc));
    mg_error_new(L, rc == UV_ENOENT ? "not_found" : rc == UV_EACCES ? "denied" : "failed", 0);
    return 2;
  }
  p->open_handles++;                    /* the process */
  p->pid = p->h.pid;
  p->ud_alive = 1;
  u->p = p;
  strings_free(&ss);
  p->next_live = live;
  if (live) live->prev_live = p;
  live = p;
  if (!atexit_installed) {
    atexit(reap_all_at_exit);
    atexit_installed = 1;
  }
  if (limit > 0) uv_timer_start(&p->timer, on_timer, limit, 0);
  for (int i = 1; i < 3; i++) update_reading(&p->io[i]);
  lua_settop(L, ud_idx);
  return 1;

oom:
  strings_free(&ss);
  return luaL_error(L, "out of memory");
}

/* core.process.stdio() -> the runtime's own stdin (read as fd 1) and
** stdout (write), for programs that speak a protocol over them (an MCP
** server). Both must be pipes, sockets or terminals. Made once; later calls
** return the same object. */
static int stdio_ref = LUA_NOREF;

static int open_own(lua_State *L, pipe_end *pe, proc *p, int fd) {
  uv_handle_type t = uv_guess_handle(fd);
  if (t != UV_NAMED_PIPE && t != UV_TTY && t != UV_TCP)
    return luaL_error(L, "process.stdio: fd %d is not a pipe, socket or terminal", fd);
  pe->owner = p;
  uv_pipe_init(mg_loop(), &pe->pipe, 0);
  pe->pipe.data = pe;
  pe->used = 1;
  p->open_handles++;
  int rc = uv_pipe_open(&pe->pipe, fd);
  if (rc < 0) {
    pipe_close(pe);
    return luaL_error(L, "process.stdio: cannot use fd %d: %s", fd, uv_strerror(rc));
  }
  return 0;
}

static int l_stdio(lua_State *L) {
  if (stdio_ref != LUA_NOREF) {
    lua_rawgeti(L, LUA_REGISTRYINDEX, stdio_ref);
    proc_ud *u = (proc_ud *)lua_touserdata(L, -1);
    if (u && u->p) return 1;
    lua_pop(L, 1);
    luaL_unref(L, LUA_REGISTRYINDEX, stdio_ref);
    stdio_ref = LUA_NOREF;
  }
  proc_ud *u = (proc_ud *)lua_newuserdatauv(L, sizeof *u, 0);
  u->p = NULL;
  luaL_setmetatable(L, PROC_MT);
  proc *p = (proc *)calloc(1, sizeof *p);
  if (!p) return luaL_error(L, "out of memory");
  p->is_self = 1;
  p->exited = 1;             /* nothing to reap */
  p->max_line = DEFAULT_MAX_LINE;
  u->p = p;
  p->ud_alive = 1;
  ignore_sigpipe();
  open_own(L, &p->io[1], p, 0);
  open_own(L, &p->io[0], p, 1);
  p->io[2].owner = p;
  lua_pushvalue(L, -1);
  stdio_ref = luaL_ref(L, LUA_REGISTRYINDEX);
  return 1;
}

static int l_environ(lua_State *L) {
  lua_newtable(L);
  for (char **e = environ; e && *e; e++) {
    const char *eq = strchr(*e, '=');
    if (!eq || eq == *e) continue;
    lua_pushlstring(L, *e, (size_t)(eq - *e));
    lua_pushstring(L, eq + 1);
    lua_rawset(L, -3);
  }
  return 1;
}

/* Children not yet reaped (for specs and diagnostics). */
static int l_live(lua_State *L) {
  int n = 0;
  for (proc *p = live; p; p = p->next_live) n++;
  lua_pushinteger(L, n);
  return 1;
}

static const luaL_Reg proc_methods[] = {
  {"read", l_read},
  {"write", l_write},
  {"close_stdin", l_close_stdin},
  {"wait", l_wait},
  {"kill", l_kill},
  {"terminate", l_terminate},
  {"pid", l_pid},
  {"exited", l_exited},
  {"timed_out", l_timed_out},
  {"close", l_close},
  {NULL, NULL}
};

static const luaL_Reg process_funcs[] = {
  {"spawn", l_spawn},
  {"environ", l_environ},
  {"stdio", l_stdio},
  {"live", l_live},
  {NULL, NULL}
};

int mg_open_process(lua_State *L) {
  mg_register_class(L, PROC_MT, proc_methods, l_gc, l_close, l_tostring);
  luaL_newlib(L, process_funcs);
  return 1;
}
