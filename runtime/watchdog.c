/*
** watchdog.c — a task that runs too long without yielding is stopped, and
** SIGTERM/SIGINT still stop a process whose loop such a task holds.
**
** One thread runs every task; while a task runs, nothing else does, not
** even the loop's signal watcher. The scheduler brackets each resume with
** mg_watchdog_enter / mg_watchdog_leave (a counter and a few stores, no
** clock). A POSIX timer aimed at the loop thread ticks every TICK_MS
** (SIGWATCH) while there is something to watch; the tick's handler looks
** at the counter. When one resume of a watched task has lasted its limit,
** the handler sets a count hook on the running coroutine: lua_sethook is
** the call Lua allows a signal handler (lua.c stops a script on Ctrl-C the
** same way). On the task's next Lua instruction the hook
**
**   the first time   raises "watchdog: ..." in the task, an error its
**                    caller handles like any other (a server handler
**                    answers 500, a node's policy applies);
**   GRACE_MS later,  when the task caught that and kept running, yields it
**   and every        out of its loop: the scheduler ends it as failed with
**   GRACE_MS after   that message (mg_watchdog_leave tells it so), closing
**                    its to-be-closed variables.
**
** A timer and not a helper thread: a second thread would make glibc take
** its multi-threaded paths (locked malloc, cancellable syscalls) for the
** whole process, about 5% of a small request's cost. The timer stops
** after IDLE_TICKS ticks without a resume and starts again with the next
** watched one, so an idle process is not woken.
**
** A hook does not fire inside a C function, so a task stuck in one long C
** call (a pathological string.find, say) is not stopped; nor is a spin
** inside a coroutine the task resumed itself (hooks belong to one
** coroutine, and the one set is the task's).
**
** Signals. signal.c calls mg_watchdog_signal(signum) when it starts
** watching SIGTERM or SIGINT: a handler of ours goes in front of libuv's,
** notes the signal, starts the timer and passes the signal on;
** mg_watchdog_signal_seen() clears the note once the loop has handled it.
** While a signal waits because one resume holds the loop, that task is
** stopped STUCK_MS after the signal (the second stage above, whatever its
** limit); if the loop is still held EXIT_MS after that (a long C call),
** the signal's default action is restored and the signal sent again: the
** process ends.
**
** The timer is deleted and the handlers put back when the library is
** unloaded (or the process exits): their code goes with it.
*/
#define _GNU_SOURCE
#include "mg.h"

#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* glibc before 2.35 spells the SIGEV_THREAD_ID target its own way */
#ifndef sigev_notify_thread_id
#define sigev_notify_thread_id _sigev_un._tid
#endif

#define TICK_MS 20
#define IDLE_TICKS 50
#define GRACE_MS 1000
#define STUCK_MS 1000
#define EXIT_MS 2000
#define SIGWATCH (SIGRTMIN + 2)

enum { STAGE_RAISE = 1, STAGE_STOP = 2 };

/* Everything runs on the loop thread: the scheduler, the tick's handler
** and the stop-signal handler (which block each other). What a handler
** reads the scheduler writes with atomics and signal fences. */
static struct {
  /* the scheduler's */
  _Atomic uint64_t seq;          /* odd while a task runs */
  _Atomic uint64_t limit_ns;     /* the running task's limit; 0: none */
  lua_State *volatile co;        /* the running coroutine */
  uint64_t seq_local;
  int stopped;                   /* the last resume was yielded out */
  /* the tick handler's, for the hook it sets */
  volatile sig_atomic_t stage;   /* what the armed hook does */
  volatile uint64_t hooked_seq;  /* the resume the hook was set for */
  volatile uint64_t held_ns;     /* how long that resume had run */
  volatile int stop_signal;      /* the stop comes from this signal (0: the limit) */
  char message[200];
  /* signals */
  _Atomic int signum;            /* a TERM/INT the loop has not handled yet */
  struct sigaction prev_term, prev_int;
  int started, term_chained, int_chained;
  volatile sig_atomic_t ticking; /* the timer is armed */
  timer_t timer;
} W;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* timer_settime is async-signal-safe: the handlers call these too */
static void set_ticking(int on) {
  struct itimerspec its;
  memset(&its, 0, sizeof its);
  if (on) {
    its.it_interval.tv_nsec = TICK_MS * 1000000L;
    its.it_value.tv_nsec = TICK_MS * 1000000L;
  }
  W.ticking = on;
  timer_settime(W.timer, 0, &its, NULL);
}

/* ---------------------------------------------------------------- hook */

static void watch_hook(lua_State *L, lua_Debug *ar) {
  lua_sethook(L, NULL, 0, 0);
  if (W.hooked_seq != W.seq_local) return;    /* armed for an earlier resume */
  double held = (double)W.held_ns / 1e9;
  double limit = (double)atomic_load(&W.limit_ns) / 1e9;
  int sig = W.stop_signal;
  if (sig)
    snprintf(W.message, sizeof W.message,
             "watchdog: the task was stopped at %s: it had held the loop %.1f s without yielding",
             sig == SIGTERM ? "SIGTERM" : "SIGINT", held);
  else if (W.stage == STAGE_STOP)
    snprintf(W.message, sizeof W.message,
             "watchdog: the task was stopped: it kept running %.1f s without yielding "
             "(limit %g s) after its first error", held, limit);
  else
    snprintf(W.message, sizeof W.message,
             "watchdog: the task ran %.1f s without yielding (limit %g s)", held, limit);
  if (W.stage == STAGE_STOP && ar->event == LUA_HOOKCOUNT && lua_isyieldable(L)) {
    W.stopped = 1;
    lua_yield(L, 0);
    return;
  }
  /* the message alone: where the task was is in its traceback */
  lua_pushstring(L, W.message);
  lua_error(L);
}

/* --------------------------------------------------------------- ticks */

static void fire(uint64_t seq, int stage, uint64_t held, int sig) {
  lua_State *co = W.co;
  if (!co) return;
  W.stage = stage;
  W.held_ns = held;
  W.stop_signal = sig;
  W.hooked_seq = seq;
  lua_sethook(co, watch_hook, LUA_MASKCOUNT, 1);
}

/* "1234.5" into p (no printf in a handler); returns the length */
static int tenths(char *p, uint64_t ns) {
  uint64_t t = ns / 100000000u;
  char d[24];
  int n = 0, len = 0;
  d[n++] = (char)('0' + t % 10);
  d[n++] = '.';
  t /= 10;
  do { d[n++] = (char)('0' + t % 10); t /= 10; } while (t);
  while (n) p[len++] = d[--n];
  return len;
}

static void give_up(int sig, uint64_t held) {
  char line[200];
  size_t n = 0;
  const char *a = sig == SIGTERM ? "moongraph: SIGTERM: a task has held the loop "
                                 : "moongraph: SIGINT: a task has held the loop ";
  const char *b = " s and cannot be stopped (a long C call); exiting\n";
  memcpy(line, a, strlen(a));
  n = strlen(a);
  n += (size_t)tenths(line + n, held);
  memcpy(line + n, b, strlen(b));
  n += strlen(b);
  ssize_t w = write(2, line, n);
  (void)w;
  signal(sig, SIG_DFL);
  kill(getpid(), sig);
}

/* One tick, on the loop thread: has the resume running now (if any) held
** the loop too long, or past a stop signal? */
static void on_tick(int signo) {
  (void)signo;
  static uint64_t seen, since, sig_at;
  static int fired, sig_fired, idle;
  int e = errno;
  uint64_t now = mono_ns();
  uint64_t s = atomic_load_explicit(&W.seq, memory_order_relaxed);
  int sig = atomic_load(&W.signum);
  if (s != seen) {
    seen = s;
    since = now;
    fired = sig_fired = idle = 0;
  } else if (!(s & 1) && !sig && ++idle >= IDLE_TICKS) {
    set_ticking(0);                 /* nothing ran for a while: sleep */
  }
  if (!sig) sig_at = 0;
  else if (!sig_at) sig_at = now;
  if (s & 1) {
    uint64_t held = now - since;
    uint64_t limit = atomic_load_explicit(&W.limit_ns, memory_order_relaxed);
    if (limit && held >= limit + (uint64_t)fired * GRACE_MS * 1000000u) {
      fire(s, fired ? STAGE_STOP : STAGE_RAISE, held, 0);
      fired++;
    }
    if (sig) {
      uint64_t from = since > sig_at ? since : sig_at;
      uint64_t waited = now - from;
      if (!sig_fired && waited >= (uint64_t)STUCK_MS * 1000000u) {
        fire(s, STAGE_STOP, held, sig);
        sig_fired = 1;
      } else if (sig_fired && waited >= (uint64_t)(STUCK_MS + EXIT_MS) * 1000000u) {
        give_up(sig, held);
      }
    }
  }
  errno = e;
}

static void start(void) {
  if (W.started) return;
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_tick;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaddset(&sa.sa_mask, SIGTERM);   /* on_stop_signal waits for a tick */
  sigaddset(&sa.sa_mask, SIGINT);
  sigaction(SIGWATCH, &sa, NULL);
  struct sigevent ev;
  memset(&ev, 0, sizeof ev);
  ev.sigev_notify = SIGEV_THREAD_ID;
  ev.sigev_signo = SIGWATCH;
  ev.sigev_notify_thread_id = (pid_t)syscall(SYS_gettid);
  if (timer_create(CLOCK_MONOTONIC, &ev, &W.timer) != 0) return;
  W.started = 1;
}

/* ----------------------------------------------------------- interface */

void mg_watchdog_enter(lua_State *co, uint64_t limit_ns) {
  W.co = co;
  W.stopped = 0;
  atomic_store_explicit(&W.limit_ns, limit_ns, memory_order_relaxed);
  atomic_store_explicit(&W.seq, ++W.seq_local, memory_order_relaxed);
  /* a tick from here on sees this resume, so one that stopped the timer
  ** ran before: it is started again below */
  atomic_signal_fence(memory_order_seq_cst);
  if (limit_ns && !W.ticking) {
    start();
    if (W.started) set_ticking(1);
  }
}

int mg_watchdog_leave(lua_State *co) {
  atomic_signal_fence(memory_order_seq_cst);
  atomic_store_explicit(&W.seq, ++W.seq_local, memory_order_relaxed);
  atomic_signal_fence(memory_order_seq_cst);
  W.co = NULL;
  /* a hook armed for this resume that had no time to fire */
  if (W.hooked_seq == W.seq_local - 1 && lua_gethook(co) == watch_hook)
    lua_sethook(co, NULL, 0, 0);
  return W.stopped;
}

const char *mg_watchdog_message(void) {
  return W.message;
}

static void on_stop_signal(int sig, siginfo_t *si, void *uc) {
  int e = errno;
  atomic_store(&W.signum, sig);
  if (W.started && !W.ticking) set_ticking(1);
  struct sigaction *p = sig == SIGTERM ? &W.prev_term : &W.prev_int;
  if (p->sa_flags & SA_SIGINFO) {
    if (p->sa_sigaction) p->sa_sigaction(sig, si, uc);
  } else if (p->sa_handler != SIG_IGN && p->sa_handler != SIG_DFL) {
    p->sa_handler(sig);
  }
  errno = e;
}

void mg_watchdog_signal(int signum) {
  if (signum != SIGTERM && signum != SIGINT) return;
  struct sigaction *prev = signum == SIGTERM ? &W.prev_term : &W.prev_int;
  struct sigaction sa, cur;
  if (sigaction(signum, NULL, &cur) != 0 || cur.sa_sigaction == on_stop_signal) return;
  start();
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_stop_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&sa.sa_mask);
  *prev = cur;
  sigaction(signum, &sa, NULL);
  if (signum == SIGTERM) W.term_chained = 1;
  else W.int_chained = 1;
}

void mg_watchdog_signal_seen(int signum) {
  int expected = signum;
  atomic_compare_exchange_strong(&W.signum, &expected, 0);
}

/* The handlers live in this library: when it is unloaded (lua_close in a
** plain lua5.4 that required moongraph.core), they and the timer must be
** gone first. Also runs at exit. */
__attribute__((destructor)) static void watchdog_unload(void) {
  if (W.term_chained) sigaction(SIGTERM, &W.prev_term, NULL);
  if (W.int_chained) sigaction(SIGINT, &W.prev_int, NULL);
  if (!W.started) return;
  signal(SIGWATCH, SIG_IGN);
  timer_delete(W.timer);
  W.started = W.ticking = 0;
}
