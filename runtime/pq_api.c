/*
** pq_api.c — fills the libpq table of pq_api.h on first use.
*/
#define MG_PQ_API_IMPL
#include "pq_api.h"
#include "lazylib.h"

#include <string.h>

#define PQ_SONAME "libpq.so.5"

struct mg_pq_api mg_pq;

const char *mg_pq_load(void) {
  static int loaded;
  static char err[512];
  if (loaded) return NULL;
  if (err[0]) return err;
  void *h = mg_lazylib_open(PQ_SONAME, err, sizeof err);
  if (!h) return err;
  struct mg_pq_api api;
  void *p;
#define MG_PQ_BIND(f) \
  if (!(p = mg_lazylib_sym(h, PQ_SONAME, #f, err, sizeof err))) return err; \
  memcpy(&api.f, &p, sizeof p);
  MG_PQ_FUNCS(MG_PQ_BIND)
#undef MG_PQ_BIND
  mg_pq = api;
  loaded = 1;
  return NULL;
}
