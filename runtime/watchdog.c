/*
** watchdog.c — a task that runs too long without yielding is stopped, and
** SIGTERM/SIGINT still stop a process whose loop such a task holds.
**
** One thread runs every task; while a task runs, nothing else does, not
** even the loop's signal watcher. The scheduler brackets each resume with
** mg_watchdog_enter / mg_watchdog_leave (a counter and a few stores, no
** clock). A helper thread, started on first use, looks at the counter
** every TICK_MS. When one resume of a watched task has lasted its limit,
** it signals the loop thread (SIGWATCH), whose handler sets a count hook
** on the running coroutine: lua_sethook is the call Lua allows a signal
** handler (lua.c stops a script on Ctrl-C the same way). On the task's next
** Lua instruction the hook
**
**   the first time   raises "watchdog: ..." in the task, an error its
**                    caller handles like any other (a server handler
**                    answers 500, a node's policy applies);
**   GRACE_MS later,  when the task caught that and kept running, yields it
**   and every        out of its loop: the scheduler ends it as failed with
**   GRACE_MS after   that message (mg_watchdog_leave tells it so), closing
**                    its to-be-closed variables.
**
** A hook does not fire inside a C function, so a task stuck in one long C
** call (a pathological string.find, say) is not stopped; nor is a spin
** inside a coroutine the task resumed itself (hooks belong to one
** coroutine, and the one set is the task's).
**
** Signals. signal.c calls mg_watchdog_signal(signum) when it starts
** watching SIGTERM or SIGINT: a handler of ours goes in front of libuv's,
** notes the signal and passes it on, and mg_watchdog_signal_seen() clears
** the note once the loop has handled it. While a signal waits because one
** resume holds the loop, that task is stopped STUCK_MS after the signal
** (the second stage above, whatever its limit); if the loop is still held
** EXIT_MS after that (a long C call), the signal's default action is
** restored and the signal sent again: the process ends.
**
** The helper is joined and the handlers put back when the library is
** unloaded (or the process exits): their code goes with it.
*/
#define _GNU_SOURCE
#include "mg.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define TICK_MS 20
#define GRACE_MS 1000
#define STUCK_MS 1000
#define EXIT_MS 2000
#define SIGWATCH (SIGRTMIN + 2)

enum { STAGE_RAISE = 1, STAGE_STOP = 2 };

static struct {
  /* written by the loop thread, read by the helper and the handler */
  _Atomic uint64_t seq;          /* odd while a task runs */
  _Atomic uint64_t limit_ns;     /* the running task's limit; 0: none */
  lua_State *volatile co;        /* the running coroutine */
  /* written by the helper before it signals */
  _Atomic uint64_t fire_seq;     /* the resume to stop */
  _Atomic int fire_stage;
  _Atomic uint64_t fire_held_ns; /* how long that resume had run */
  _Atomic int fire_signal;       /* the stop comes from this signal (0: the limit) */
  /* the loop thread's own (the handler runs on it) */
  uint64_t seq_local;
  volatile sig_atomic_t stage;   /* what the armed hook does */
  volatile uint64_t hooked_seq;  /* the resume the hook was set for */
  int stopped;                   /* the last resume was yielded out */
  char message[200];
  /* signals */
  _Atomic int signum;            /* a TERM/INT the loop has not handled yet */
  struct sigaction prev_term, prev_int;
  int started, term_chained, int_chained;
  _Atomic int quit;              /* the helper ends (the library goes) */
  pthread_t loop_thread, helper;
} W;

static uint64_t mono_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* ---------------------------------------------------------------- hook */

static void watch_hook(lua_State *L, lua_Debug *ar) {
  lua_sethook(L, NULL, 0, 0);
  if (W.hooked_seq != W.seq_local) return;    /* armed for an earlier resume */
  double held = (double)atomic_load(&W.fire_held_ns) / 1e9;
  double limit = (double)atomic_load(&W.limit_ns) / 1e9;
  int sig = atomic_load(&W.fire_signal);
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

static void on_watch_signal(int sig) {
  (void)sig;
  int e = errno;
  uint64_t s = atomic_load(&W.seq);
  lua_State *co = W.co;
  if ((s & 1) && s == atomic_load(&W.fire_seq) && co) {
    W.stage = atomic_load(&W.fire_stage);
    W.hooked_seq = s;
    lua_sethook(co, watch_hook, LUA_MASKCOUNT, 1);
  }
  errno = e;
}

/* -------------------------------------------------------------- helper */

static void fire(uint64_t seq, int stage, uint64_t held, int sig) {
  atomic_store(&W.fire_stage, stage);
  atomic_store(&W.fire_held_ns, held);
  atomic_store(&W.fire_signal, sig);
  atomic_store(&W.fire_seq, seq);
  pthread_kill(W.loop_thread, SIGWATCH);
}

static void give_up(int sig, uint64_t held) {
  char line[200];
  int n = snprintf(line, sizeof line,
                   "moongraph: %s: a task has held the loop %.1f s and cannot be stopped "
                   "(a long C call); exiting\n",
                   sig == SIGTERM ? "SIGTERM" : "SIGINT", (double)held / 1e9);
  if (n > 0) {
    ssize_t w = write(2, line, (size_t)n);
    (void)w;
  }
  signal(sig, SIG_DFL);
  kill(getpid(), sig);
}

static void *helper_main(void *arg) {
  (void)arg;
  uint64_t seen = 0, since = 0, sig_at = 0;
  int fired = 0, sig_fired = 0;
  struct timespec tick = {0, TICK_MS * 1000000L};
  while (!atomic_load(&W.quit)) {
    nanosleep(&tick, NULL);
    uint64_t now = mono_ns();
    uint64_t s = atomic_load(&W.seq);
    uint64_t limit = atomic_load(&W.limit_ns);
    if (atomic_load(&W.seq) != s) continue;   /* a limit of another resume */
    if (s != seen) {
      seen = s;
      since = now;
      fired = sig_fired = 0;
    }
    int sig = atomic_load(&W.signum);
    if (!sig) sig_at = 0;
    else if (!sig_at) sig_at = now;
    if (!(s & 1)) continue;
    uint64_t held = now - since;
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
  return NULL;
}

static void start(void) {
  if (W.started) return;
  W.started = 1;
  W.loop_thread = pthread_self();
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_watch_signal;
  sa.sa_flags = SA_RESTART;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGWATCH, &sa, NULL);
  /* the helper takes no signal: process signals go to the loop thread */
  sigset_t all, old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  if (pthread_create(&W.helper, NULL, helper_main, NULL) != 0) W.started = 0;
  pthread_sigmask(SIG_SETMASK, &old, NULL);
}

/* ----------------------------------------------------------- interface */

void mg_watchdog_enter(lua_State *co, uint64_t limit_ns) {
  if (limit_ns && !W.started) start();
  W.co = co;
  W.stopped = 0;
  atomic_store_explicit(&W.limit_ns, limit_ns, memory_order_relaxed);
  atomic_store_explicit(&W.seq, ++W.seq_local, memory_order_release);
}

int mg_watchdog_leave(lua_State *co) {
  atomic_store_explicit(&W.seq, ++W.seq_local, memory_order_release);
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
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_stop_signal;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigfillset(&sa.sa_mask);
  *prev = cur;
  sigaction(signum, &sa, NULL);
  if (signum == SIGTERM) W.term_chained = 1;
  else W.int_chained = 1;
  start();
}

/* The helper's code and the handlers live in this library: when it is
** unloaded (lua_close in a plain lua5.4 that required moongraph.core),
** they must be gone first. Also runs at exit. */
__attribute__((destructor)) static void watchdog_unload(void) {
  if (W.term_chained) sigaction(SIGTERM, &W.prev_term, NULL);
  if (W.int_chained) sigaction(SIGINT, &W.prev_int, NULL);
  if (!W.started) return;
  signal(SIGWATCH, SIG_IGN);
  atomic_store(&W.quit, 1);
  pthread_join(W.helper, NULL);
  W.started = 0;
}

void mg_watchdog_signal_seen(int signum) {
  int expected = signum;
  atomic_compare_exchange_strong(&W.signum, &expected, 0);
}
