/*
** sse_fuzz.c — libFuzzer harness for the incremental SSE parser (runtime/sse.c).
**
** Input layout: byte 0 picks max_bytes (0..127: the default limit, otherwise a
** small limit so the overflow paths run), byte 1 seeds the chunking; the rest
** is the stream. For every input the harness checks, besides ASan/UBSan:
**
**   1. feeding the stream whole gives the same events and error status as a
**      separate, non-incremental reference parser written from the spec;
**   2. feeding it in pseudo-random chunks, one byte at a time, and split in
**      two (at every position of short inputs) gives the same result;
**   3. after mg_sse_reset() the parser gives the same result again.
**
** Any mismatch aborts, which libFuzzer reports as a crash with the input.
*/
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "sse.h"

/* ---- an event log: events serialised into one byte string ---- */

typedef struct {
  char *p;
  size_t len, cap;
} log_t;

static void log_bytes(log_t *l, const void *s, size_t n) {
  if (l->len + n > l->cap) {
    size_t cap = l->cap ? l->cap : 256;
    while (cap < l->len + n) cap *= 2;
    l->p = realloc(l->p, cap);
    if (!l->p) abort();
    l->cap = cap;
  }
  memcpy(l->p + l->len, s, n);
  l->len += n;
}

static void log_field(log_t *l, const char *s, size_t n) {
  log_bytes(l, &n, sizeof n);
  log_bytes(l, s, n);
}

static void log_event(log_t *l, const char *ev, size_t evn, const char *data,
                      size_t datan, const char *id, size_t idn, long retry) {
  log_bytes(l, "E", 1);
  log_field(l, ev, evn);
  log_field(l, data, datan);
  log_field(l, id, idn);
  log_bytes(l, &retry, sizeof retry);
}

static void log_status(log_t *l, int failed) {
  log_bytes(l, failed ? "X" : "K", 1);
}

static int on_event(void *ud, const mg_sse_event *ev) {
  log_event((log_t *)ud, ev->event, ev->event_len, ev->data, ev->data_len,
            ev->id, ev->id_len, ev->retry);
  return 0;
}

/* ---- reference parser: whole input at once, straight from the spec ---- */

typedef struct {
  char *data; size_t data_len;
  char *event; size_t event_len;
  char *id; size_t id_len;
  long block_retry;
} ref_state;

/* Returns 0 or -1 when the limit is exceeded. */
static int ref_line(ref_state *st, const char *s, size_t n, size_t max,
                    log_t *out) {
  if (n > max) return -1;
  if (n == 0) {
    if (st->data_len > 0) {
      log_event(out, st->event_len ? st->event : "message",
                st->event_len ? st->event_len : 7, st->data, st->data_len - 1,
                st->id, st->id_len, st->block_retry);
    }
    st->data_len = 0;
    st->event_len = 0;
    st->block_retry = -1;
    return 0;
  }
  if (s[0] == ':') return 0;
  size_t c = 0;
  while (c < n && s[c] != ':') c++;
  const char *name = s;
  size_t name_len = c;
  const char *v = s + n;
  size_t vn = 0;
  if (c < n) {
    v = s + c + 1;
    vn = n - c - 1;
    if (vn && v[0] == ' ') { v++; vn--; }
  }
  if (name_len == 4 && !memcmp(name, "data", 4)) {
    if (st->data_len + vn + 1 > max) return -1;
    memcpy(st->data + st->data_len, v, vn);
    st->data_len += vn;
    st->data[st->data_len++] = '\n';
  } else if (name_len == 5 && !memcmp(name, "event", 5)) {
    memcpy(st->event, v, vn);
    st->event_len = vn;
  } else if (name_len == 2 && !memcmp(name, "id", 2)) {
    for (size_t i = 0; i < vn; i++) if (v[i] == 0) return 0;
    memcpy(st->id, v, vn);
    st->id_len = vn;
  } else if (name_len == 5 && !memcmp(name, "retry", 5)) {
    if (vn == 0) return 0;
    long ms = 0;
    int saturated = 0;
    for (size_t i = 0; i < vn; i++) {
      if (v[i] < '0' || v[i] > '9') return 0;
      if (saturated) continue;
      if (__builtin_mul_overflow(ms, 10L, &ms) ||
          __builtin_add_overflow(ms, (long)(v[i] - '0'), &ms)) {
        ms = LONG_MAX;
        saturated = 1;
      }
    }
    st->block_retry = ms;
  }
  return 0;
}

static void ref_parse(const char *s, size_t n, size_t max, log_t *out) {
  static const char bom[3] = { '\xEF', '\xBB', '\xBF' };
  /* A stream shorter than the BOM that matches its start is held back by an
  ** incremental parser (it may still become a BOM): nothing to do. */
  if (n < 3 && memcmp(s, bom, n) == 0) { log_status(out, 0); return; }
  if (n >= 3 && memcmp(s, bom, 3) == 0) { s += 3; n -= 3; }
  ref_state st = { 0 };
  st.data = malloc(n + 2);
  st.event = malloc(n + 1);
  st.id = malloc(n + 1);
  st.block_retry = -1;
  int failed = 0;
  size_t i = 0;
  while (i < n) {
    size_t j = i;
    while (j < n && s[j] != '\r' && s[j] != '\n') j++;
    if (j == n) {               /* unterminated last line: never processed */
      if (j - i > max) failed = 1;
      break;
    }
    if (ref_line(&st, s + i, j - i, max, out)) { failed = 1; break; }
    if (s[j] == '\r' && j + 1 < n && s[j + 1] == '\n') j++;
    i = j + 1;
  }
  log_status(out, failed);
  free(st.data);
  free(st.event);
  free(st.id);
}

/* ---- incremental runs ---- */

static void feed_chunks(mg_sse *p, const char *s, size_t n, const size_t *cuts,
                        size_t ncuts, log_t *out) {
  size_t at = 0;
  int rc = MG_SSE_OK;
  for (size_t k = 0; k <= ncuts && rc == MG_SSE_OK; k++) {
    size_t to = k < ncuts ? cuts[k] : n;
    rc = mg_sse_feed(p, s + at, to - at, on_event, out);
    at = to;
  }
  if (rc == MG_SSE_ESTOP) abort();
  log_status(out, rc != MG_SSE_OK);
}

static void expect_same(const log_t *a, const log_t *b, const char *what) {
  if (a->len != b->len || memcmp(a->p, b->p, a->len) != 0) {
    fprintf(stderr, "sse_fuzz: %s differs from the whole-stream parse\n", what);
    abort();
  }
}

static uint32_t rng_next(uint32_t *x) {
  *x ^= *x << 13;
  *x ^= *x >> 17;
  *x ^= *x << 5;
  return *x;
}

int LLVMFuzzerTestOneInput(const uint8_t *in, size_t size) {
  if (size < 2) return 0;
  size_t max = in[0] < 128 ? 0 : (size_t)(in[0] & 63) + 1;
  uint32_t seed = 0x9E3779B9u ^ ((uint32_t)in[1] * 2654435761u);
  const char *s = (const char *)in + 2;
  size_t n = size - 2;
  size_t eff_max = max ? max : MG_SSE_DEFAULT_MAX;

  log_t ref = { 0 }, whole = { 0 }, got = { 0 };
  ref_parse(s, n, eff_max, &ref);

  mg_sse p;
  mg_sse_init(&p, max);
  feed_chunks(&p, s, n, NULL, 0, &whole);
  expect_same(&ref, &whole, "reference parser");

  /* the same parser after reset */
  mg_sse_reset(&p);
  feed_chunks(&p, s, n, NULL, 0, &got);
  expect_same(&got, &whole, "parse after reset");

  /* pseudo-random chunk sizes (1..16 bytes, sometimes empty chunks) */
  size_t cap = 2 * n + 2;
  size_t *cuts = malloc(cap * sizeof *cuts);
  size_t ncuts = 0, at = 0;
  while (at < n && ncuts < cap - 1) {
    at += rng_next(&seed) % 17;
    if (at > n) at = n;
    cuts[ncuts++] = at;
  }
  if (at < n) cuts[ncuts++] = n;
  mg_sse_reset(&p);
  got.len = 0;
  feed_chunks(&p, s, n, cuts, ncuts, &got);
  expect_same(&got, &whole, "random chunking");

  /* one byte at a time */
  for (size_t i = 0; i < n; i++) cuts[i] = i + 1;
  mg_sse_reset(&p);
  got.len = 0;
  feed_chunks(&p, s, n, cuts, n, &got);
  expect_same(&got, &whole, "byte-at-a-time");

  /* two chunks: split at every position of short inputs, at 32
  ** pseudo-random positions of longer ones */
  size_t splits = n <= 96 ? n + 1 : 32;
  for (size_t i = 0; i < splits; i++) {
    cuts[0] = n <= 96 ? i : rng_next(&seed) % (n + 1);
    mg_sse_reset(&p);
    got.len = 0;
    feed_chunks(&p, s, n, cuts, 1, &got);
    expect_same(&got, &whole, "two-chunk split");
  }

  free(cuts);
  mg_sse_free(&p);
  free(ref.p);
  free(whole.p);
  free(got.p);
  return 0;
}
