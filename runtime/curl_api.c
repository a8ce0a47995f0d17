/*
** curl_api.c — fills the libcurl table of curl_api.h on first use.
*/
#define MG_CURL_API_IMPL
#include "curl_api.h"
#include "lazylib.h"

#include <string.h>

/* the soname of libcurl 7 and 8 alike */
#define CURL_SONAME "libcurl.so.4"

struct mg_curl_api mg_curl;

const char *mg_curl_load(void) {
  static int loaded;
  static char err[512];
  if (loaded) return NULL;
  if (err[0]) return err;
  void *h = mg_lazylib_open(CURL_SONAME, err, sizeof err);
  if (!h) return err;
  struct mg_curl_api api;
  void *p;
#define MG_CURL_BIND(f) \
  if (!(p = mg_lazylib_sym(h, CURL_SONAME, #f, err, sizeof err))) return err; \
  memcpy(&api.f, &p, sizeof p);
  MG_CURL_FUNCS(MG_CURL_BIND)
#undef MG_CURL_BIND
  mg_curl = api;
  loaded = 1;
  return NULL;
}
