/*
** route_fuzz.c — libFuzzer harness for the route table and the
** percent-decoding of request paths (runtime/route.c).
**
** Input layout: byte 0 picks the method; with bit 7 of byte 1 set, the
** lines before the first empty line are route patterns ("METHOD /pattern")
** added to a table of their own, otherwise a fixed table like an
** application's is used; what remains is a request-target. Besides
** ASan/UBSan, the harness checks that:
**
**   1. a match's decoded path has no NUL, is no longer than the target,
**      and its parameters lie inside it, one per parameter of the route;
**   2. NOT_ALLOWED comes with at least one allowed method, BAD_PATH with
**      no path;
**   3. any byte string without '/' or NUL, percent-encoded byte by byte,
**      comes back whole as the :id of GET /items/:id, and as the rest of
**      the files route's *rest parameter behind a literal segment;
**   4. mg_percent_decode never writes more than it read, and decoding the
**      byte-by-byte encoding of its output gives that output again.
*/
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "route_fuzz: %s\n", what);
    abort();
  }
}

static const char *const fixed[][2] = {
  {"GET", "/"},
  {"GET", "/health"},
  {"GET", "/items/:id"},
  {"DELETE", "/items/:id"},
  {"GET", "/items/:id/parts/:part"},
  {"GET", "/items/new"},
  {"POST", "/chat/messages"},
  {"GET", "/chat/messages/:job_id/stream"},
  {"GET", "/files/*rest"},
  {"*", "/any/*rest"},
  {"PUT", "/a/b/c/d/e/f"},
};
#define NFIXED (sizeof fixed / sizeof fixed[0])
#define ITEMS 2   /* GET /items/:id */
#define FILES 8   /* the files route: its rest parameter */

static mg_routes table;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  char err[256];
  for (size_t i = 0; i < NFIXED; i++)
    if (mg_routes_add(&table, fixed[i][0], fixed[i][1], (int)i, err, sizeof err)) abort();
  if (mg_routes_finish(&table, err, sizeof err)) abort();
  return 0;
}

static void check_match(const mg_routes *t, int r, const mg_route_match *m,
                        const char *target, size_t len) {
  if (r == MG_ROUTE_BAD_PATH) {
    check(m->path == NULL, "BAD_PATH with a path");
    return;
  }
  check(m->path != NULL, "no decoded path");
  check(m->path_len <= len, "decoded path longer than the target");
  check(m->path[m->path_len] == '\0', "decoded path not terminated");
  check(memchr(m->path, '\0', m->path_len) == NULL, "NUL in the decoded path");
  check(m->path_len > 0 && m->path[0] == '/', "decoded path does not start with '/'");
  if (m->query) {
    check(m->query >= target && m->query + m->query_len <= target + len, "query outside the target");
    check(m->query[-1] == '?', "query does not follow '?'");
  }
  if (r == MG_ROUTE_NOT_ALLOWED) check(m->allowed != 0 || m->any_method, "405 without an allowed method");
  if (r != MG_ROUTE_FOUND) return;
  check(m->route >= 0, "FOUND without a route");
  check(m->nparams == mg_route_nparams(t, m->route), "parameter count differs from the route's");
  for (int i = 0; i < m->nparams; i++) {
    check(m->params[i].off <= m->path_len && m->params[i].len <= m->path_len - m->params[i].off,
          "parameter outside the path");
    check(mg_route_param(t, m->route, i) != NULL, "parameter without a name");
  }
}

static char *encode(const char *s, size_t n, size_t *outlen) {
  static const char hex[] = "0123456789ABCDEF";
  char *o = malloc(n * 3 + 1);
  if (!o) abort();
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    o[3 * i] = '%';
    o[3 * i + 1] = hex[c >> 4];
    o[3 * i + 2] = hex[c & 15];
  }
  *outlen = n * 3;
  return o;
}

/* Property 3: an encoded value comes back as the parameter. */
static void roundtrip(const char *v, size_t n) {
  if (n == 0 || n > 1000 || memchr(v, '/', n) || memchr(v, '\0', n)) return;
  size_t el;
  char *enc = encode(v, n, &el);
  char *target = malloc(el + 16);
  if (!target) abort();
  memcpy(target, "/items/", 7);
  memcpy(target + 7, enc, el);
  mg_route_match m;
  int r = mg_routes_match(&table, HTTP_GET, target, 7 + el, &m);
  check(r == MG_ROUTE_FOUND, "an encoded :id did not match /items/:id");
  /* "new" is a literal route of its own */
  int is_new = n == 3 && memcmp(v, "new", 3) == 0;
  check(m.route == (is_new ? 5 : ITEMS), "an encoded :id matched another route");
  if (!is_new) {
    check(m.nparams == 1 && m.params[0].len == n &&
          memcmp(m.path + m.params[0].off, v, n) == 0, "the :id came back changed");
  }
  free(m.path);
  memcpy(target, "/files/x/", 9);
  memcpy(target + 9, enc, el);
  r = mg_routes_match(&table, HTTP_GET, target, 9 + el, &m);
  check(r == MG_ROUTE_FOUND && m.route == FILES, "an encoded rest did not match /files/*rest");
  check(m.nparams == 1 && m.params[0].len == n + 2 &&
        memcmp(m.path + m.params[0].off, "x/", 2) == 0 &&
        memcmp(m.path + m.params[0].off + 2, v, n) == 0, "the *rest came back changed");
  free(m.path);
  free(target);
  free(enc);
}

/* Property 4. */
static void decode_props(const char *s, size_t n, int plus) {
  char *out = malloc(n + 1);
  if (!out) abort();
  ssize_t d = mg_percent_decode(s, n, out, plus);
  if (d >= 0) {
    check((size_t)d <= n, "decoded more than was read");
    check(memchr(out, '\0', (size_t)d) == NULL, "decoded a NUL");
    size_t el;
    char *enc = encode(out, (size_t)d, &el);
    char *back = malloc(el + 1);
    if (!back) abort();
    ssize_t d2 = mg_percent_decode(enc, el, back, 0);
    check(d2 == d && memcmp(back, out, (size_t)d) == 0, "decode(encode(x)) != x");
    free(back);
    free(enc);
  }
  free(out);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 2) return 0;
  unsigned method = data[0] % 34;   /* DELETE .. the last method http-parser names */
  const char *s = (const char *)data + 2;
  size_t n = size - 2;
  const mg_routes *t = &table;
  mg_routes own = {0};
  if (data[1] & 0x80) {
    char err[256];
    const char *end = NULL;
    for (size_t i = 0; i + 1 < n; i++)
      if (s[i] == '\n' && s[i + 1] == '\n') { end = s + i; break; }
    if (!end) return 0;
    const char *p = s;
    int id = 0;
    while (p < end) {
      const char *nl = memchr(p, '\n', (size_t)(end - p));
      if (!nl) nl = end;
      char line[256];
      size_t ll = (size_t)(nl - p);
      if (ll < sizeof line) {
        memcpy(line, p, ll);
        line[ll] = '\0';
        char *sp = strchr(line, ' ');
        if (sp && strlen(line) == ll) {
          *sp = '\0';
          mg_routes_add(&own, line, sp + 1, id++, err, sizeof err);
        }
      }
      p = nl + 1;
    }
    if (mg_routes_finish(&own, err, sizeof err) != 0) {
      mg_routes_free(&own);
      return 0;
    }
    n -= (size_t)(end + 2 - s);
    s = end + 2;
    t = &own;
  }
  mg_route_match m;
  int r = mg_routes_match(t, method, s, n, &m);
  check_match(t, r, &m, s, n);
  free(m.path);
  if (t == &own) mg_routes_free(&own);
  else roundtrip(s, n);
  decode_props(s, n, data[1] & 1);
  return 0;
}
