/*
** http1_fuzz.c — libFuzzer harness for the server's request reader
** (runtime/http1.c over http-parser), fed arbitrary bytes the way
** server.c feeds it: a request is taken as soon as it is complete and the
** bytes after it (pipelining) go back into the same reader.
**
** Input layout: byte 0 picks the limits (small ones, so the 413/414/431
** paths run), byte 1 seeds the chunking; the rest is what a client sent.
** Besides ASan/UBSan, the harness checks that:
**
**   1. every request taken is well formed: its target and headers lie
**      inside its head, header names are lower-case tokens, values have no
**      NUL, the body is within max_body and the head within max_header; it
**      has at most one Host header, and one when it is HTTP/1.1;
**   2. the bytes reported used never exceed what was fed, and a reader that
**      wants more has used everything;
**   3. feeding the stream whole, in pseudo-random chunks and one byte at a
**      time gives the same requests and the same end (a client cannot
**      change the outcome by how it splits its writes); the same error
**      status too, except that a size limit (413, 414, 431) may be reached
**      in a small piece before the parser meets a syntax error further on.
**
** Any failed check aborts, which libFuzzer reports with the input.
*/
#include <ctype.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "http1.h"

typedef struct {
  char *p;
  size_t len, cap;
} log_t;

static void put(log_t *l, const void *s, size_t n) {
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

static void put_field(log_t *l, const char *s, size_t n) {
  put(l, &n, sizeof n);
  put(l, s, n);
}

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "http1_fuzz: %s\n", what);
    abort();
  }
}

static void log_request(log_t *l, const mg_h1_request *q, const mg_h1_limits *lim) {
  check(q->target_len < q->head_len, "target outside the head");
  check(q->head[q->target_len] == '\0', "target not terminated");
  check(q->body_len <= lim->max_body, "body over max_body");
  check(q->body_len == 0 || q->body != NULL, "body bytes without a buffer");
  check(q->nheaders <= MG_H1_MAX_HEADERS, "too many headers kept");
  check(q->major == 1, "a version other than 1.x accepted");
  put(l, "R", 1);
  const char *m = mg_h1_method(q);
  put_field(l, m, strlen(m));
  unsigned flags = q->minor | q->keep_alive << 4 | q->chunked << 5 | q->upgrade << 6 |
                   q->expect_continue << 7;
  put(l, &flags, sizeof flags);
  put_field(l, q->head, q->target_len);
  size_t pos = 0, vl;
  const char *name, *value;
  int n = 0;
  while (mg_h1_next_header(q, &pos, &name, &value, &vl)) {
    check(value + vl <= q->head + q->head_len, "header value outside the head");
    check(mg_h1_valid_name(name, strlen(name)), "header name not a token");
    for (const char *c = name; *c; c++) check(!isupper((unsigned char)*c), "header name not lower-case");
    check(memchr(value, '\0', vl) == NULL, "NUL inside a header value");
    put_field(l, name, strlen(name));
    put_field(l, value, vl);
    n++;
  }
  check(n == q->nheaders, "header count differs from the headers listed");
  const char *host = mg_h1_header(q, "host", &vl);
  check(host == NULL || vl == strlen(host), "mg_h1_header length wrong");
  check(host != NULL || q->minor == 0, "an HTTP/1.1 request without Host taken");
  int hosts = 0;
  pos = 0;
  while (mg_h1_next_header(q, &pos, &name, &value, &vl)) hosts += strcmp(name, "host") == 0;
  check(hosts <= 1, "a request with two Host headers taken");
  put_field(l, q->body ? q->body : "", q->body_len);
}

/* Feed data in chunks of the sizes `next` gives; log requests and the end. */
static int run(log_t *l, const mg_h1_limits *lim, const char *data, size_t len,
               size_t (*next)(uint32_t *), uint32_t seed) {
  mg_h1_reader r;
  mg_h1_reader_init(&r, lim);
  /* what the server holds: bytes received and not yet used */
  char *in = malloc(len + 1);
  if (!in) abort();
  size_t have = 0, off = 0;
  int status = 0;
  while (!status) {
    if (off < len) {
      size_t n = next(&seed);
      if (n > len - off) n = len - off;
      memcpy(in + have, data + off, n);
      have += n;
      off += n;
    } else if (have == 0) {
      break;
    }
    while (have > 0) {
      size_t used;
      int ev = mg_h1_feed(&r, in, have, &used);
      check(used <= have, "used more than was fed");
      memmove(in, in + used, have - used);
      have -= used;
      if (ev == MG_H1_ERROR) {
        check(r.status >= 400 && r.status <= 599, "error without a 4xx/5xx status");
        check(r.reason != NULL, "error without a reason");
        status = r.status;
        break;
      }
      if (ev == MG_H1_REQUEST) {
        mg_h1_request *q = mg_h1_take(&r);
        check(q != NULL, "a request event without a request");
        log_request(l, q, lim);
        int upgrade = q->upgrade;
        mg_h1_request_free(q);
        if (upgrade) { status = 101; break; }   /* the server closes after it */
        continue;
      }
      check(have == 0, "wants more but left bytes unused");
    }
    if (off >= len) break;
  }
  if (!status) status = mg_h1_in_body(&r) ? 2 : mg_h1_in_head(&r) ? 1 : 0;
  /* the log says whether it ended in an error; which one is compared apart */
  int end = status >= 400 ? 400 : status;
  put(l, "S", 1);
  put(l, &end, sizeof end);
  mg_h1_reader_free(&r);
  free(in);
  return status;
}

static int is_limit(int status) { return status == 413 || status == 414 || status == 431; }

/* The same error, or a size limit that a smaller piece reached before the
** parser saw the syntax error further on (counting is incremental). */
static int same_error(int a, int b) {
  return a == b || is_limit(a) || is_limit(b);
}

static size_t whole(uint32_t *s) { (void)s; return SIZE_MAX; }
static size_t one(uint32_t *s) { (void)s; return 1; }
static size_t random_chunk(uint32_t *s) {
  *s = *s * 1103515245u + 12345u;
  return 1 + (*s >> 16) % 23;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  mg_h1_limits lim;
  switch (data[0] & 3) {
    case 0: lim.max_header = 16384; lim.max_body = 1024 * 1024; break;
    case 1: lim.max_header = 64; lim.max_body = 16; break;
    case 2: lim.max_header = 200 + data[0]; lim.max_body = 0; break;
    default: lim.max_header = 128; lim.max_body = data[0]; break;
  }
  uint32_t seed = data[1];
  const char *s = (const char *)data + 2;
  size_t n = size - 2;
  log_t a = {0}, b = {0}, c = {0};
  int sa = run(&a, &lim, s, n, whole, seed);
  int sb = run(&b, &lim, s, n, random_chunk, seed);
  int sc = run(&c, &lim, s, n, one, seed);
  if (a.len != b.len || memcmp(a.p, b.p, a.len) != 0 || !same_error(sa, sb))
    check(0, "whole and chunked feeding differ");
  if (a.len != c.len || memcmp(a.p, c.p, a.len) != 0 || !same_error(sa, sc))
    check(0, "whole and byte-by-byte feeding differ");
  free(a.p);
  free(b.p);
  free(c.p);
  return 0;
}
