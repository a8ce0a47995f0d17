/*
** sse_client.c — the SSE load client of `make bench-server`: N concurrent
** Server-Sent Events streams on one libuv loop, measuring how late each
** event arrives.
**
**   build/sse_client HOST PORT PATH N SECONDS
**
** Opens N HTTP/1.1 connections (at most 256 connecting at a time), sends
** `GET PATH` on each and reads the event streams. Every event's data must
** be JSON with a field "t": the server's CLOCK_MONOTONIC time in seconds
** when it wrote the event (mg.now() on the moongraph side); the delivery
** delay is our CLOCK_MONOTONIC time on reading the event minus t, so client
** and server must run on the same machine. Chunked framing lines are
** skipped: only "data:" lines are read.
**
** Prints "connected N SECONDS_TO_CONNECT" once every stream has delivered
** its first event (the driver samples the server's RSS then), measures for
** SECONDS more, and prints
**   "events RECEIVED EXPECTED", "delay_ms P50 P99 MAX", "errors N".
** Raises its own RLIMIT_NOFILE to the hard limit.
*/
#define _GNU_SOURCE
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>

#include <uv.h>

#define MAX_CONNECTING 256
#define LINE_MAX_LEN 1024

typedef struct {
  uv_tcp_t tcp;
  uv_connect_t connect;
  uv_write_t write;
  int index;
  int got_first;
  int closed;
  size_t line_len;
  char line[LINE_MAX_LEN];
} client;

static struct {
  uv_loop_t *loop;
  struct sockaddr_in addr;
  char request[512];
  size_t request_len;
  int n, started, connecting, first_events, errors, open;
  double seconds;
  uint64_t t_begin, t_all_connected, t_end;
  double *delays;
  size_t ndelays, cap;
  long long received;
  uv_timer_t stop_timer;
  client *clients;
  int measuring;
} G;

static double now_s(void) { return (double)uv_hrtime() / 1e9; }

static void start_more(void);

static void on_closed(uv_handle_t *h) {
  (void)h;
  G.open--;
}

static void fail(client *c, const char *what, int status) {
  if (c->closed) return;
  c->closed = 1;
  G.errors++;
  if (G.errors <= 5)
    fprintf(stderr, "sse_client: stream %d: %s: %s\n", c->index, what,
            status ? uv_strerror(status) : "closed");
  if (!c->got_first) G.first_events++;   /* do not wait for it */
  uv_close((uv_handle_t *)&c->tcp, on_closed);
}

static void record(double delay) {
  if (!G.measuring) return;
  if (G.ndelays == G.cap) {
    G.cap = G.cap ? G.cap * 2 : 1 << 16;
    G.delays = realloc(G.delays, G.cap * sizeof *G.delays);
    if (!G.delays) { perror("realloc"); exit(1); }
  }
  G.delays[G.ndelays++] = delay;
  G.received++;
}

static void stop_loop(uv_timer_t *t) { uv_stop(t->loop); }

static void all_connected(void) {
  G.t_all_connected = uv_hrtime();
  printf("connected %d %.2f\n", G.n - G.errors,
         (double)(G.t_all_connected - G.t_begin) / 1e9);
  fflush(stdout);
  G.measuring = 1;
  uv_timer_start(&G.stop_timer, stop_loop, (uint64_t)(G.seconds * 1000), 0);
}

static void on_line(client *c, const char *s, size_t n) {
  if (n < 5 || memcmp(s, "data:", 5) != 0) return;
  const char *t = memmem(s, n, "\"t\":", 4);
  if (!t) return;
  double sent = strtod(t + 4, NULL);
  double delay = now_s() - sent;
  if (!c->got_first) {
    c->got_first = 1;
    if (++G.first_events == G.n) all_connected();
    return;
  }
  record(delay);
}

static void on_alloc(uv_handle_t *h, size_t suggested, uv_buf_t *buf) {
  (void)h; (void)suggested;
  static char slab[65536];
  buf->base = slab;
  buf->len = sizeof slab;
}

static void on_read(uv_stream_t *s, ssize_t nread, const uv_buf_t *buf) {
  client *c = s->data;
  if (nread < 0) { fail(c, "read", nread == UV_EOF ? 0 : (int)nread); return; }
  for (ssize_t i = 0; i < nread; i++) {
    char ch = buf->base[i];
    if (ch == '\n') {
      size_t n = c->line_len;
      if (n && c->line[n - 1] == '\r') n--;
      on_line(c, c->line, n);
      c->line_len = 0;
    } else if (c->line_len < LINE_MAX_LEN) {
      c->line[c->line_len++] = ch;
    }
  }
}

static void on_written(uv_write_t *w, int status) {
  client *c = w->data;
  if (status) fail(c, "write", status);
}

static void on_connect(uv_connect_t *req, int status) {
  client *c = req->data;
  G.connecting--;
  start_more();
  if (status) { fail(c, "connect", status); return; }
  uv_buf_t b = uv_buf_init(G.request, (unsigned)G.request_len);
  c->write.data = c;
  uv_write(&c->write, (uv_stream_t *)&c->tcp, &b, 1, on_written);
  uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

static void start_more(void) {
  while (G.started < G.n && G.connecting < MAX_CONNECTING) {
    client *c = &G.clients[G.started];
    c->index = G.started++;
    uv_tcp_init(G.loop, &c->tcp);
    c->tcp.data = c;
    c->connect.data = c;
    G.open++;
    G.connecting++;
    int r = uv_tcp_connect(&c->connect, &c->tcp, (struct sockaddr *)&G.addr, on_connect);
    if (r) { G.connecting--; fail(c, "connect", r); }
  }
}

static int cmp(const void *a, const void *b) {
  double x = *(const double *)a, y = *(const double *)b;
  return x < y ? -1 : x > y;
}

int main(int argc, char **argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: %s HOST PORT PATH N SECONDS\n", argv[0]);
    return 2;
  }
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < rl.rlim_max) {
    rl.rlim_cur = rl.rlim_max;
    setrlimit(RLIMIT_NOFILE, &rl);
  }
  G.loop = uv_default_loop();
  if (uv_ip4_addr(argv[1], atoi(argv[2]), &G.addr)) {
    fprintf(stderr, "sse_client: bad address %s\n", argv[1]);
    return 2;
  }
  G.request_len = (size_t)snprintf(G.request, sizeof G.request,
      "GET %s HTTP/1.1\r\nHost: %s:%s\r\nAccept: text/event-stream\r\n\r\n",
      argv[3], argv[1], argv[2]);
  G.n = atoi(argv[4]);
  G.seconds = atof(argv[5]);
  G.clients = calloc((size_t)G.n, sizeof *G.clients);
  if (!G.clients || G.n <= 0) { fprintf(stderr, "sse_client: bad N\n"); return 2; }
  uv_timer_init(G.loop, &G.stop_timer);
  G.t_begin = uv_hrtime();
  start_more();
  uv_run(G.loop, UV_RUN_DEFAULT);

  long long expected = (long long)(G.n - G.errors) * (long long)G.seconds;
  printf("events %lld %lld\n", G.received, expected);
  if (G.ndelays) {
    qsort(G.delays, G.ndelays, sizeof *G.delays, cmp);
    printf("delay_ms %.3f %.3f %.3f\n", G.delays[G.ndelays / 2] * 1e3,
           G.delays[(size_t)((double)G.ndelays * 0.99)] * 1e3,
           G.delays[G.ndelays - 1] * 1e3);
  } else {
    printf("delay_ms nan nan nan\n");
  }
  printf("errors %d\n", G.errors);
  return G.measuring ? 0 : 1;
}
