/*
** server.h — the pieces of the HTTP server that server.c puts together:
** the route table (route.c), static files (static.c) and TLS (tls.c).
** Each is pure C over plain buffers and file descriptors; none touches Lua
** or the loop.
*/
#ifndef MG_SERVER_H
#define MG_SERVER_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "http1.h"

/* ---------------------------------------------------------------- routes
**
** A route is "METHOD /pattern": METHOD is an HTTP method in capitals or
** "*" (any); the pattern's segments are literals, ":name" (one non-empty
** segment) or a final "*name" (the rest of the path, one or more
** segments). Matching works on the percent-decoded segments of the path,
** so "%2F" inside a segment never splits it. When several routes match,
** the more specific wins (a literal segment beats ":name", which beats
** "*name"), and a route for the request's method beats one for "*". HEAD
** is served by a GET route when no HEAD route matches.
*/
#define MG_ROUTE_MAX_PARAMS 16

typedef struct mg_route mg_route;

typedef struct {
  mg_route *v;
  int n;
} mg_routes;

enum { MG_ROUTE_FOUND, MG_ROUTE_NOT_FOUND, MG_ROUTE_NOT_ALLOWED, MG_ROUTE_BAD_PATH };

typedef struct {
  int route;                  /* the route's id (as given to mg_routes_add) */
  char *path;                 /* the decoded path (malloc'd; caller frees) */
  size_t path_len;
  const char *query;          /* raw query string, inside the target; or NULL */
  size_t query_len;
  int nparams;
  struct { uint32_t off, len; } params[MG_ROUTE_MAX_PARAMS];  /* in path */
  uint64_t allowed;           /* NOT_ALLOWED / FOUND: bit per http_method */
  int any_method;             /* some route for the path takes any method */
} mg_route_match;

/* Add a route; returns 0, or -1 with a message in err. */
int mg_routes_add(mg_routes *t, const char *method, const char *pattern, int id,
                  char *err, size_t errlen);
/* Order the routes by precedence; -1 with a message when two are the same. */
int mg_routes_finish(mg_routes *t, char *err, size_t errlen);
/* Match a request-target (origin or absolute form) for a method. */
int mg_routes_match(const mg_routes *t, unsigned method, const char *target,
                    size_t len, mg_route_match *m);
/* Number of parameters of route `id` and the name of the i-th (0-based). */
int mg_route_nparams(const mg_routes *t, int id);
const char *mg_route_param(const mg_routes *t, int id, int i);
void mg_routes_free(mg_routes *t);
/* Percent-decode s into out (capacity >= n); -1 on a bad escape or NUL. */
ssize_t mg_percent_decode(const char *s, size_t n, char *out, int plus_is_space);

/* ---------------------------------------------------------- static files
**
** mg_static_open resolves a decoded request path under a root directory
** and opens the file for GET/HEAD. Resolution never leaves the root: ".."
** segments are refused, and the file is opened with openat2(2)
** RESOLVE_BENEATH (a symlink may point inside the root, never outside);
** kernels without openat2 get the same rule by checking the realpath of
** what was opened. A directory serves its index.html; a directory asked
** without a trailing slash is redirected to it.
*/
typedef struct {
  int fd;                     /* open file when status is 200, else -1 */
  int status;                 /* 200, 301, 304, 403, 404 */
  uint64_t size;
  const char *content_type;
  char etag[48];              /* "size-mtime" in hex, quoted */
  char last_modified[32];
} mg_static_file;

typedef struct {
  int dirfd;                  /* the root, O_PATH */
  char *real;                 /* its realpath */
} mg_static_root;

int mg_static_root_open(mg_static_root *root, const char *dir, char *err, size_t errlen);
void mg_static_root_close(mg_static_root *root);
void mg_static_open(const mg_static_root *root, const char *path, size_t len,
                    const mg_h1_request *q, mg_static_file *f);
const char *mg_static_content_type(const char *path, size_t len);

#endif
