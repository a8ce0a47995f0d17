/*
** static.c — static files for the server: resolving a request path under
** a root directory without escaping it, opening the file, and the
** metadata of its response (content type, ETag, Last-Modified, 304).
**
** The root is held open (O_PATH) for the life of the server; each request
** resolves relative to it. Paths with "." or ".." segments and dot files
** (".env", ".git/...") are not served. Opening uses openat2(2) with
** RESOLVE_BENEATH, so neither ".." nor a symlink can lead outside the root;
** where the kernel lacks openat2, the file is opened with openat(2) and its
** real path (from /proc/self/fd) must lie under the root's. The caller
** sends the bytes and closes f->fd.
*/
#define _GNU_SOURCE
#include "server.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <linux/openat2.h>

int mg_static_root_open(mg_static_root *root, const char *dir, char *err, size_t errlen) {
  root->dirfd = -1;
  root->real = realpath(dir, NULL);
  if (!root->real) {
    snprintf(err, errlen, "static directory '%s': %s", dir, strerror(errno));
    return -1;
  }
  root->dirfd = open(root->real, O_PATH | O_DIRECTORY | O_CLOEXEC);
  if (root->dirfd < 0) {
    snprintf(err, errlen, "static directory '%s': %s", dir, strerror(errno));
    free(root->real);
    root->real = NULL;
    return -1;
  }
  return 0;
}

void mg_static_root_close(mg_static_root *root) {
  if (root->dirfd >= 0) close(root->dirfd);
  free(root->real);
  root->dirfd = -1;
  root->real = NULL;
}

static const struct { const char *ext, *type; } types[] = {
  {"html", "text/html; charset=utf-8"},
  {"htm", "text/html; charset=utf-8"},
  {"css", "text/css; charset=utf-8"},
  {"js", "text/javascript; charset=utf-8"},
  {"mjs", "text/javascript; charset=utf-8"},
  {"json", "application/json"},
  {"map", "application/json"},
  {"txt", "text/plain; charset=utf-8"},
  {"md", "text/markdown; charset=utf-8"},
  {"csv", "text/csv; charset=utf-8"},
  {"xml", "application/xml"},
  {"svg", "image/svg+xml"},
  {"png", "image/png"},
  {"jpg", "image/jpeg"},
  {"jpeg", "image/jpeg"},
  {"gif", "image/gif"},
  {"webp", "image/webp"},
  {"avif", "image/avif"},
  {"ico", "image/x-icon"},
  {"wasm", "application/wasm"},
  {"woff", "font/woff"},
  {"woff2", "font/woff2"},
  {"ttf", "font/ttf"},
  {"otf", "font/otf"},
  {"pdf", "application/pdf"},
  {"mp3", "audio/mpeg"},
  {"mp4", "video/mp4"},
  {"webm", "video/webm"},
  {"webmanifest", "application/manifest+json"},
};

const char *mg_static_content_type(const char *path, size_t len) {
  size_t i = len;
  while (i > 0 && path[i - 1] != '.' && path[i - 1] != '/') i--;
  if (i == 0 || path[i - 1] != '.') return "application/octet-stream";
  size_t n = len - i;
  for (size_t k = 0; k < sizeof types / sizeof types[0]; k++) {
    if (strlen(types[k].ext) == n && strncasecmp(types[k].ext, path + i, n) == 0)
      return types[k].type;
  }
  return "application/octet-stream";
}

/* Every segment is a plain name: not empty (except a final one, which means
** "the directory"), not starting with '.'. */
static int safe_path(const char *path, size_t len) {
  if (len == 0 || path[0] != '/') return 0;
  size_t i = 1;
  while (i < len) {
    size_t j = i;
    while (j < len && path[j] != '/') j++;
    if (j == i && j < len) return 0;          /* "//" */
    if (j > i && path[i] == '.') return 0;    /* ".", "..", dot files */
    i = j + 1;
  }
  return 1;
}

static int open_beneath(const mg_static_root *root, const char *rel) {
  static int have_openat2 = 1;
  if (have_openat2) {
    struct open_how how;
    memset(&how, 0, sizeof how);
    how.flags = O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK;
    how.resolve = RESOLVE_BENEATH | RESOLVE_NO_MAGICLINKS;
    int fd = (int)syscall(SYS_openat2, root->dirfd, rel, &how, sizeof how);
    if (fd >= 0 || errno != ENOSYS) return fd;
    have_openat2 = 0;
  }
  int fd = openat(root->dirfd, rel, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) return -1;
  char link[64], real[PATH_MAX];
  snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(link, real, sizeof real - 1);
  size_t rl = strlen(root->real);
  if (n < 0 || (size_t)n <= rl || memcmp(real, root->real, rl) != 0 ||
      (real[rl] != '/' && root->real[rl - 1] != '/')) {
    close(fd);
    errno = EXDEV;
    return -1;
  }
  return fd;
}

/* Does If-None-Match (a list of entity tags, or "*") name etag? */
static int etag_listed(const char *list, size_t n, const char *etag) {
  size_t el = strlen(etag);
  size_t i = 0;
  while (i < n) {
    while (i < n && (list[i] == ' ' || list[i] == ',' || list[i] == '\t')) i++;
    size_t j = i;
    while (j < n && list[j] != ',') j++;
    size_t e = j;
    while (e > i && (list[e - 1] == ' ' || list[e - 1] == '\t')) e--;
    const char *tag = list + i;
    size_t tl = e - i;
    if (tl == 1 && tag[0] == '*') return 1;
    if (tl > 2 && tag[0] == 'W' && tag[1] == '/') { tag += 2; tl -= 2; }   /* weak compare */
    if (tl == el && memcmp(tag, etag, el) == 0) return 1;
    i = j + 1;
  }
  return 0;
}

void mg_static_open(const mg_static_root *root, const char *path, size_t len,
                    const mg_h1_request *q, mg_static_file *f) {
  memset(f, 0, sizeof *f);
  f->fd = -1;
  f->status = 404;
  if (!safe_path(path, len) || len > PATH_MAX - 16) return;
  char rel[PATH_MAX];
  size_t rn = len - 1;
  memcpy(rel, path + 1, rn);
  int dir_asked = rn == 0 || rel[rn - 1] == '/';
  if (dir_asked) {
    memcpy(rel + rn, "index.html", 10);
    rn += 10;
  }
  rel[rn] = '\0';
  int fd = open_beneath(root, rel);
  if (fd < 0) {
    if (errno == EACCES) f->status = 403;
    return;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    close(fd);
    return;
  }
  if (S_ISDIR(st.st_mode)) {
    close(fd);
    if (!dir_asked) {
      /* is there an index to redirect to? */
      char idx[PATH_MAX + 16];
      snprintf(idx, sizeof idx, "%s/index.html", rel);
      int ifd = open_beneath(root, idx);
      if (ifd >= 0) {
        close(ifd);
        f->status = 301;
      }
    }
    return;
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return;
  }
  f->size = (uint64_t)st.st_size;
  f->content_type = mg_static_content_type(rel, rn);
  snprintf(f->etag, sizeof f->etag, "\"%llx-%llx\"", (unsigned long long)st.st_size,
           (unsigned long long)st.st_mtim.tv_sec * 1000000000ull +
           (unsigned long long)st.st_mtim.tv_nsec);
  mg_h1_http_date(f->last_modified, (int64_t)st.st_mtim.tv_sec);
  size_t vl;
  const char *inm = q ? mg_h1_header(q, "if-none-match", &vl) : NULL;
  if (inm) {
    if (etag_listed(inm, vl, f->etag)) {
      close(fd);
      f->status = 304;
      return;
    }
  } else {
    const char *ims = q ? mg_h1_header(q, "if-modified-since", &vl) : NULL;
    int64_t t = ims ? mg_h1_parse_date(ims, vl) : -1;
    if (t >= 0 && (int64_t)st.st_mtim.tv_sec <= t) {
      close(fd);
      f->status = 304;
      return;
    }
  }
  /* the file was opened non-blocking (a FIFO must not hang the loop);
  ** reads of a regular file block as usual */
  int fl = fcntl(fd, F_GETFL);
  if (fl >= 0) fcntl(fd, F_SETFL, fl & ~O_NONBLOCK);
  f->fd = fd;
  f->status = 200;
}
