/*
** static_fuzz.c — libFuzzer harness for static file resolution
** (runtime/static.c), reached the way a request reaches it: bytes read by
** the request reader (http1.c), the target decoded by the route matcher
** (route.c), then mg_static_open under a root directory.
**
** The root is made once, in build/fuzz/static-fuzz-tree (beside the
** harness, made afresh on each start), next to a directory it must never
** serve:
**
**   base/root/a.txt  index.html  sub/index.html  sub/c.css  .env
**   base/root/in -> a.txt              (a symlink that stays inside)
**   base/root/out -> ../outside/secret.txt, outdir -> ../outside,
**   base/root/abs -> BASE/outside/secret.txt   (symlinks that leave)
**   base/outside/secret.txt
**
** Input: with byte 0 even the rest is a request-target for GET, else it is
** a whole request as a client sends it (headers such as If-None-Match and
** If-Modified-Since included). Besides ASan/UBSan, the harness checks that
** every file opened lies under the root (its real path, read back from
** /proc/self/fd), is not a dot file, is a regular file whose size matches,
** and that every status is one mg_static_open documents.
*/
#define _GNU_SOURCE
#include <fcntl.h>
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "server.h"

static void check(int ok, const char *what) {
  if (!ok) {
    fprintf(stderr, "static_fuzz: %s\n", what);
    abort();
  }
}

static char base[PATH_MAX];
static mg_static_root root;
static mg_routes none;
static mg_h1_limits limits = {4096, 4096};

static void write_file(const char *rel, const char *text) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", base, rel);
  FILE *f = fopen(p, "w");
  if (!f) abort();
  fputs(text, f);
  fclose(f);
}

static void link_to(const char *target, const char *rel) {
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/%s", base, rel);
  if (symlink(target, p) != 0) abort();
}

static void cleanup(void) {
  char cmd[PATH_MAX + 16];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", base);
  if (system(cmd) != 0) fprintf(stderr, "static_fuzz: could not remove %s\n", base);
}

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc;
  (void)argv;
  /* beside the harness (build/fuzz/), made afresh on each start, so that a
  ** crash (which skips atexit) leaves nothing behind in /tmp */
  char self[PATH_MAX];
  ssize_t sl = readlink("/proc/self/exe", self, sizeof self - 1);
  if (sl <= 0) abort();
  self[sl] = '\0';
  char *slash = strrchr(self, '/');
  if (slash) *slash = '\0';
  snprintf(base, sizeof base, "%s/static-fuzz-tree", self);
  cleanup();
  if (mkdir(base, 0755) != 0) abort();
  atexit(cleanup);
  char p[PATH_MAX];
  snprintf(p, sizeof p, "%s/root", base);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/root/sub", base);
  mkdir(p, 0755);
  snprintf(p, sizeof p, "%s/outside", base);
  mkdir(p, 0755);
  write_file("root/a.txt", "hello\n");
  write_file("root/index.html", "<p>index</p>\n");
  write_file("root/sub/index.html", "<p>sub</p>\n");
  write_file("root/sub/c.css", "p{}\n");
  write_file("root/.env", "SECRET=1\n");
  write_file("outside/secret.txt", "secret\n");
  link_to("a.txt", "root/in");
  link_to("../outside/secret.txt", "root/out");
  link_to("../outside", "root/outdir");
  snprintf(p, sizeof p, "%s/outside/secret.txt", base);
  link_to(p, "root/abs");
  char err[256];
  snprintf(p, sizeof p, "%s/root", base);
  if (mg_static_root_open(&root, p, err, sizeof err) != 0) {
    fprintf(stderr, "static_fuzz: %s\n", err);
    abort();
  }
  if (mg_routes_finish(&none, err, sizeof err) != 0) abort();
  return 0;
}

static void check_file(const char *path, size_t len, const mg_static_file *f) {
  switch (f->status) {
    case 200: case 301: case 304: case 403: case 404: break;
    default: check(0, "a status mg_static_open does not document");
  }
  if (f->status != 200) {
    check(f->fd < 0, "an open file with a status other than 200");
    return;
  }
  check(f->fd >= 0, "200 without a file");
  char link[64], real[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", f->fd);
  ssize_t n = readlink(link, real, sizeof real - 1);
  check(n > 0, "cannot read back the opened file's path");
  real[n] = '\0';
  size_t rl = strlen(root.real);
  if (strncmp(real, root.real, rl) != 0 || real[rl] != '/') {
    fprintf(stderr, "static_fuzz: '%.*s' opened %s, outside %s\n", (int)len, path, real, root.real);
    abort();
  }
  check(strstr(real + rl, "/.") == NULL, "a dot file was served");
  struct stat st;
  check(fstat(f->fd, &st) == 0 && S_ISREG(st.st_mode), "served something not a regular file");
  check((uint64_t)st.st_size == f->size, "size differs from the file's");
  check(f->content_type != NULL && f->etag[0] == '"', "no content type or ETag");
  close(f->fd);
}

static void serve(unsigned method, const char *target, size_t tl, const mg_h1_request *q) {
  mg_route_match m;
  int r = mg_routes_match(&none, method, target, tl, &m);
  if (r == MG_ROUTE_BAD_PATH) return;
  mg_static_file f;
  mg_static_open(&root, m.path, m.path_len, q, &f);
  check_file(m.path, m.path_len, &f);
  free(m.path);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  const char *s = (const char *)data + 1;
  size_t n = size - 1;
  if (!(data[0] & 1)) {
    serve(HTTP_GET, s, n, NULL);
    return 0;
  }
  mg_h1_reader r;
  mg_h1_reader_init(&r, &limits);
  size_t used;
  if (mg_h1_feed(&r, s, n, &used) == MG_H1_REQUEST) {
    mg_h1_request *q = mg_h1_take(&r);
    serve(q->method, q->head, q->target_len, q);
    mg_h1_request_free(q);
  }
  mg_h1_reader_free(&r);
  return 0;
}
