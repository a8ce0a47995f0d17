/*
** route.c — the server's route table: "METHOD /pattern" entries compiled
** into segments, ordered by precedence, and matched against request
** targets (see server.h for the rules).
**
** A table is built once when a server starts listening and never changes
** afterwards; matching allocates only the decoded path it hands back.
*/
#include "server.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { SEG_LIT, SEG_PARAM, SEG_REST };

typedef struct {
  int kind;
  char *text;                 /* literal, or parameter name */
  size_t len;
} seg;

struct mg_route {
  int id;
  int any;                    /* method "*" */
  unsigned method;
  char *source;               /* "METHOD /pattern", for messages */
  int nseg;
  seg *segs;
  int nparams;
};

static int method_of(const char *s, unsigned *m) {
  for (unsigned i = 0; i < 64; i++) {
    const char *name = http_method_str((enum http_method)i);
    if (!name || strcmp(name, "<unknown>") == 0) break;
    if (strcmp(name, s) == 0) { *m = i; return 0; }
  }
  return -1;
}

static void route_free(mg_route *r) {
  for (int i = 0; i < r->nseg; i++) free(r->segs[i].text);
  free(r->segs);
  free(r->source);
}

int mg_routes_add(mg_routes *t, const char *method, const char *pattern, int id,
                  char *err, size_t errlen) {
  mg_route r;
  memset(&r, 0, sizeof r);
  r.id = id;
  if (strcmp(method, "*") == 0) {
    r.any = 1;
  } else if (method_of(method, &r.method) != 0) {
    snprintf(err, errlen, "unknown method '%s'", method);
    return -1;
  }
  if (pattern[0] != '/') {
    snprintf(err, errlen, "path of '%s %s' must start with '/'", method, pattern);
    return -1;
  }
  size_t plen = strlen(pattern);
  r.source = malloc(strlen(method) + plen + 2);
  if (!r.source) goto oom;
  sprintf(r.source, "%s %s", method, pattern);
  /* segments: split after the leading '/' */
  int cap = 1;
  for (const char *c = pattern + 1; *c; c++) cap += *c == '/';
  r.segs = calloc((size_t)cap, sizeof *r.segs);
  if (!r.segs) goto oom;
  const char *p = pattern + 1;
  for (;;) {
    const char *e = strchr(p, '/');
    size_t n = e ? (size_t)(e - p) : strlen(p);
    seg *s = &r.segs[r.nseg++];
    if (n > 0 && (p[0] == ':' || p[0] == '*')) {
      s->kind = p[0] == ':' ? SEG_PARAM : SEG_REST;
      if (n == 1) {
        snprintf(err, errlen, "'%s': a parameter needs a name", r.source);
        goto fail;
      }
      if (s->kind == SEG_REST && e) {
        snprintf(err, errlen, "'%s': '*%.*s' must be the last segment", r.source,
                 (int)(n - 1), p + 1);
        goto fail;
      }
      if (++r.nparams > MG_ROUTE_MAX_PARAMS) {
        snprintf(err, errlen, "'%s': more than %d parameters", r.source, MG_ROUTE_MAX_PARAMS);
        goto fail;
      }
      s->text = strndup(p + 1, n - 1);
      s->len = n - 1;
      for (int i = 0; i < r.nseg - 1; i++) {
        if (r.segs[i].kind != SEG_LIT && s->text && strcmp(r.segs[i].text, s->text) == 0) {
          snprintf(err, errlen, "'%s': parameter '%s' appears twice", r.source, s->text);
          goto fail;
        }
      }
    } else {
      s->kind = SEG_LIT;
      /* literals compare with decoded segments, so decode them too */
      s->text = malloc(n + 1);
      ssize_t d = s->text ? mg_percent_decode(p, n, s->text, 0) : -1;
      if (d < 0) {
        snprintf(err, errlen, "'%s': bad percent-encoding", r.source);
        goto fail;
      }
      s->text[d] = '\0';
      s->len = (size_t)d;
    }
    if (!s->text) goto oom;
    if (!e) break;
    p = e + 1;
  }
  mg_route *v = realloc(t->v, (size_t)(t->n + 1) * sizeof *v);
  if (!v) goto oom;
  t->v = v;
  t->v[t->n++] = r;
  return 0;
oom:
  snprintf(err, errlen, "out of memory");
fail:
  route_free(&r);
  return -1;
}

/* <0 when a is more specific than b; 0 when they have the same shape */
static int shape_cmp(const mg_route *a, const mg_route *b) {
  int n = a->nseg < b->nseg ? a->nseg : b->nseg;
  for (int i = 0; i < n; i++) {
    const seg *x = &a->segs[i], *y = &b->segs[i];
    if (x->kind != y->kind) return x->kind - y->kind;
    if (x->kind == SEG_LIT) {
      int c = x->len != y->len ? (x->len < y->len ? -1 : 1) : memcmp(x->text, y->text, x->len);
      if (c) return c;
    }
  }
  return b->nseg - a->nseg;
}

static int route_cmp(const void *pa, const void *pb) {
  const mg_route *a = pa, *b = pb;
  int c = shape_cmp(a, b);
  if (c) return c;
  if (a->any != b->any) return a->any - b->any;
  if (a->method != b->method) return a->method < b->method ? -1 : 1;
  return a->id - b->id;
}

int mg_routes_finish(mg_routes *t, char *err, size_t errlen) {
  if (t->n > 1) qsort(t->v, (size_t)t->n, sizeof *t->v, route_cmp);
  for (int i = 1; i < t->n; i++) {
    const mg_route *a = &t->v[i - 1], *b = &t->v[i];
    if (shape_cmp(a, b) == 0 && a->any == b->any && a->method == b->method) {
      snprintf(err, errlen, "routes '%s' and '%s' match the same requests",
               a->source, b->source);
      return -1;
    }
  }
  return 0;
}

static const mg_route *by_id(const mg_routes *t, int id) {
  for (int i = 0; i < t->n; i++)
    if (t->v[i].id == id) return &t->v[i];
  return NULL;
}

int mg_route_nparams(const mg_routes *t, int id) {
  const mg_route *r = by_id(t, id);
  return r ? r->nparams : 0;
}

const char *mg_route_param(const mg_routes *t, int id, int i) {
  const mg_route *r = by_id(t, id);
  if (!r) return NULL;
  for (int k = 0; k < r->nseg; k++) {
    if (r->segs[k].kind == SEG_LIT) continue;
    if (i-- == 0) return r->segs[k].text;
  }
  return NULL;
}

void mg_routes_free(mg_routes *t) {
  for (int i = 0; i < t->n; i++) route_free(&t->v[i]);
  free(t->v);
  t->v = NULL;
  t->n = 0;
}

static int hexval(int c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

ssize_t mg_percent_decode(const char *s, size_t n, char *out, int plus_is_space) {
  size_t o = 0;
  for (size_t i = 0; i < n; i++) {
    char c = s[i];
    if (c == '%') {
      if (i + 2 >= n) return -1;
      int h = hexval((unsigned char)s[i + 1]), l = hexval((unsigned char)s[i + 2]);
      if (h < 0 || l < 0) return -1;
      c = (char)(h * 16 + l);
      i += 2;
    } else if (c == '+' && plus_is_space) {
      c = ' ';
    }
    if (c == '\0') return -1;
    out[o++] = c;
  }
  return (ssize_t)o;
}

#define MAX_SEGS 128

static int pattern_matches(const mg_route *r, const char *path, size_t plen,
                           const uint32_t *off, const uint32_t *slen, int nseg,
                           mg_route_match *m) {
  int np = 0;
  for (int i = 0; i < r->nseg; i++) {
    const seg *s = &r->segs[i];
    if (s->kind == SEG_REST) {
      if (i >= nseg) return 0;
      m->params[np].off = off[i];
      m->params[np].len = (uint32_t)(plen - off[i]);
      np++;
      m->nparams = np;
      return 1;
    }
    if (i >= nseg) return 0;
    if (s->kind == SEG_LIT) {
      if (slen[i] != s->len || memcmp(path + off[i], s->text, s->len) != 0) return 0;
    } else {
      if (slen[i] == 0) return 0;
      m->params[np].off = off[i];
      m->params[np].len = slen[i];
      np++;
    }
  }
  if (r->nseg != nseg) return 0;
  m->nparams = np;
  return 1;
}

int mg_routes_match(const mg_routes *t, unsigned method, const char *target,
                    size_t len, mg_route_match *m) {
  memset(m, 0, sizeof *m);
  m->route = -1;
  /* absolute form: skip "scheme://authority" */
  if (len > 0 && target[0] != '/') {
    const char *sep = len > 3 ? memchr(target, ':', len) : NULL;
    if (!sep || (size_t)(sep - target) + 3 > len || memcmp(sep, "://", 3) != 0)
      return MG_ROUTE_BAD_PATH;
    const char *p = sep + 3;
    const char *slash = memchr(p, '/', len - (size_t)(p - target));
    if (!slash) return MG_ROUTE_BAD_PATH;
    len -= (size_t)(slash - target);
    target = slash;
  }
  if (len == 0) return MG_ROUTE_BAD_PATH;
  const char *q = memchr(target, '?', len);
  const char *h = memchr(target, '#', len);
  size_t plen = q ? (size_t)(q - target) : h ? (size_t)(h - target) : len;
  if (q) {
    m->query = q + 1;
    m->query_len = (h && h > q ? (size_t)(h - q) : len - (size_t)(q - target)) - 1;
  }
  /* decode segment by segment: an encoded '/' stays inside its segment */
  m->path = malloc(plen + 1);
  if (!m->path) return MG_ROUTE_BAD_PATH;
  uint32_t off[MAX_SEGS], slen[MAX_SEGS];
  int nseg = 0;
  size_t o = 0, i = 0;
  while (i < plen) {
    /* target[i] == '/' */
    m->path[o++] = '/';
    size_t j = i + 1;
    while (j < plen && target[j] != '/') j++;
    if (nseg == MAX_SEGS) goto bad;
    ssize_t d = mg_percent_decode(target + i + 1, j - i - 1, m->path + o, 0);
    if (d < 0) goto bad;
    off[nseg] = (uint32_t)o;
    slen[nseg] = (uint32_t)d;
    nseg++;
    o += (size_t)d;
    i = j;
  }
  m->path[o] = '\0';
  m->path_len = o;
  const mg_route *head_fallback = NULL;
  mg_route_match fb;
  for (int k = 0; k < t->n; k++) {
    const mg_route *r = &t->v[k];
    mg_route_match tmp = *m;
    if (!pattern_matches(r, m->path, o, off, slen, nseg, &tmp)) continue;
    if (r->any) m->any_method = 1;
    else m->allowed |= (uint64_t)1 << r->method;
    if (r->any || r->method == method) {
      tmp.route = r->id;
      tmp.allowed = m->allowed;
      tmp.any_method = m->any_method;
      *m = tmp;
      return MG_ROUTE_FOUND;
    }
    if (method == HTTP_HEAD && r->method == HTTP_GET && !head_fallback) {
      head_fallback = r;
      fb = tmp;
    }
  }
  if (head_fallback) {
    fb.route = head_fallback->id;
    fb.allowed = m->allowed;
    fb.any_method = m->any_method;
    *m = fb;
    return MG_ROUTE_FOUND;
  }
  return m->allowed ? MG_ROUTE_NOT_ALLOWED : MG_ROUTE_NOT_FOUND;
bad:
  free(m->path);
  m->path = NULL;
  return MG_ROUTE_BAD_PATH;
}
