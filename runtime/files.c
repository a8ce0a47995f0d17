/*
** files.c — durable file operations (core.files; core.store, its name in
** earlier versions, is the same table): the file saver's logs, the embedded
** API's records, pid and lock files.
**
**   files.write(path, data)  atomic replace: temp file, write, fsync, rename,
**                            fsync of the directory -> true | nil, err, code
**   files.append(path, data, expect [, header])
**                            append to a log: under an exclusive flock, when
**                            the file (created if missing) is `expect` bytes
**                            long (and, given `header`, starts with it),
**                            write data and fdatasync (and fsync the
**                            directory of a new file) -> size after | false,
**                            size now, what others appended since `expect`
**                            (the whole file if it is shorter, or does not
**                            start with `header`: replaced) | nil, err,
**                            code. A write that fails is cut off again (a
**                            log that did not exist is not left behind:
**                            it is written to a temp file and linked into
**                            place); a file that does not end in a newline
**                            (a record torn by a crash) gets one first, so
**                            the torn bytes stay a line of their own.
**   files.read(path [, offset]) -> contents (from byte offset) | nil, err, code
**   files.list(dir)          -> sorted entry names | nil, err, code
**   files.mkdir(path)        mkdir -p, each new directory fsync'd into its
**                            parent -> true | nil, err, code
**   files.remove(path)       rm -r (a missing path is fine) -> true | nil, err, code
**   files.lock(path)         exclusive advisory lock (flock) on the file at
**                            path, created if missing; never waits ->
**                            lock | nil, err, code ("EWOULDBLOCK": held)
**
** `err` is an error value (errors.c): code not_found, denied, no_space
** (retryable), busy (a held lock, retryable), unavailable or failed, with
** details.errno; `code` is the errno name ("ENOENT", "EACCES", ...). Each call is one work
** item on libuv's thread pool: the whole sequence of system calls runs on a
** pool thread while the calling task waits, so other tasks keep running
** (durability "async" relies on this). One work item per operation keeps a
** multi-step sequence such as the atomic write in one place instead of a
** chain of uv_fs_* callbacks.
**
** Lifetime of an operation: allocated by the Lua call, owned by the pool
** until after_work runs. If the waiting task is cancelled before that,
** after_work frees it; if the task is cancelled after being woken but
** before its continuation ran, the cancel callback frees it; otherwise the
** continuation frees it after pushing the results.
**
** A lock is a userdata owning one file descriptor: lock:unlock(), closing
** it (<close>) or collecting it closes the descriptor, which releases the
** lock; so does the end of the process. Taking a lock runs on the calling
** thread: open(2) of a local file and flock(2) with LOCK_NB do not block.
*/
#include "mg.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

enum { OP_WRITE, OP_READ, OP_LIST, OP_MKDIR, OP_REMOVE, OP_APPEND };

typedef struct {
  mg_waiter w;             /* first: the cancel callback casts back */
  uv_work_t req;
  int kind;
  char *path;
  char *data;              /* write: input; read: output */
  size_t len;
  char **names;            /* list output */
  size_t nnames, cap;
  off_t offset;            /* read: where to start; append: the expected size */
  char *header;            /* append: what the file must start with (or NULL) */
  size_t header_len;
  off_t size;              /* append: the size after (or now, when moved) */
  int moved;               /* append: the file was not `expect` bytes long */
  int err;                 /* errno of the failing step, 0 on success */
  const char *what;        /* the failing step, for the message */
  int done, cancelled;
} file_op;

static void op_free(file_op *op) {
  free(op->path);
  free(op->header);
  free(op->data);
  for (size_t i = 0; i < op->nnames; i++) free(op->names[i]);
  free(op->names);
  free(op);
}

static int fail(file_op *op, const char *what) {
  op->err = errno ? errno : EIO;
  op->what = what;
  return -1;
}

/* ------------------------------------------------------------ pool side */

static int fsync_dir_of(const char *path) {
  const char *slash = strrchr(path, '/');
  char *dir;
  if (!slash) dir = strdup(".");
  else if (slash == path) dir = strdup("/");
  else dir = strndup(path, (size_t)(slash - path));
  if (!dir) return -1;
  int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  free(dir);
  if (fd < 0) return -1;
  int rc = fsync(fd);
  int e = errno;
  close(fd);
  errno = e;
  return rc;
}

static int write_all(int fd, const char *p, size_t len) {
  size_t off = 0;
  while (off < len) {
    ssize_t w = write(fd, p + off, len - off);
    if (w < 0) {
      if (errno == EINTR) continue;
      return -1;
    }
    off += (size_t)w;
  }
  return 0;
}

static void do_write(file_op *op) {
  size_t n = strlen(op->path) + 64;
  char *tmp = malloc(n);
  if (!tmp) { fail(op, "write"); return; }
  snprintf(tmp, n, "%s.tmp.%ld.%lx", op->path, (long)getpid(),
           (unsigned long)(uintptr_t)op);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) { fail(op, "create"); free(tmp); return; }
  if (write_all(fd, op->data, op->len) < 0) { fail(op, "write"); goto bad; }
  if (fsync(fd) < 0) { fail(op, "fsync"); goto bad; }
  if (close(fd) < 0) { fd = -1; fail(op, "close"); goto bad; }
  fd = -1;
  if (rename(tmp, op->path) < 0) { fail(op, "rename"); goto bad; }
  free(tmp);
  if (fsync_dir_of(op->path) < 0) fail(op, "fsync directory of");
  return;
bad:
  if (fd >= 0) close(fd);
  unlink(tmp);
  free(tmp);
}

/* A log that does not exist yet is made whole: op->data written to a temp
** file, synced and linked into place, so a write that fails (a full disk)
** leaves no empty or half log behind. 1: made; 0: another writer made it
** meanwhile (append to theirs); -1: failed (op->err set). */
static int create_log(file_op *op) {
  size_t n = strlen(op->path) + 64;
  char *tmp = malloc(n);
  if (!tmp) return fail(op, "create");
  snprintf(tmp, n, "%s.new.%ld.%lx", op->path, (long)getpid(), (unsigned long)(uintptr_t)op);
  int fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) { fail(op, "create"); free(tmp); return -1; }
  int rc = -1;
  if (write_all(fd, op->data, op->len) < 0) fail(op, "write");
  else if (fdatasync(fd) < 0) fail(op, "fdatasync");
  else if (link(tmp, op->path) == 0) rc = 1;
  else if (errno == EEXIST) rc = 0;
  else fail(op, "link");
  close(fd);
  unlink(tmp);
  free(tmp);
  if (rc == 1) {
    op->size = (off_t)op->len;
    if (fsync_dir_of(op->path) < 0) fail(op, "fsync directory of");
  }
  return rc;
}

static void do_append(file_op *op) {
  int fd = open(op->path, O_RDWR | O_APPEND | O_CLOEXEC);
  if (fd < 0 && errno == ENOENT) {
    if (op->offset > 0) {
      /* the log the caller extends is gone: it was replaced by nothing */
      free(op->data);
      op->data = malloc(1);
      op->len = 0;
      op->moved = 1;
      op->size = 0;
      if (!op->data) fail(op, "read");
      return;
    }
    int made = create_log(op);
    if (made != 0) return;
    fd = open(op->path, O_RDWR | O_APPEND | O_CLOEXEC);
  }
  if (fd < 0) { fail(op, "open"); return; }
  /* released by close(); other writers of the log wait here */
  if (flock(fd, LOCK_EX) < 0) { fail(op, "lock"); close(fd); return; }
  struct stat st;
  if (fstat(fd, &st) < 0) { fail(op, "stat"); close(fd); return; }
  op->size = st.st_size;
  /* a file that no longer starts with the header it had was replaced */
  int replaced = 0;
  if (op->header && st.st_size > 0 && op->offset > 0) {
    size_t n = op->header_len;
    if ((off_t)n > st.st_size) replaced = 1;
    /* in pieces: a header of any length is compared, not taken as changed */
    for (size_t at = 0; !replaced && at < n;) {
      char head[256];
      size_t k = n - at < sizeof head ? n - at : sizeof head;
      ssize_t r;
      do { r = pread(fd, head, k, (off_t)at); } while (r < 0 && errno == EINTR);
      if (r < 0) { fail(op, "read"); close(fd); return; }
      replaced = (size_t)r != k || memcmp(head, op->header + at, k) != 0;
      at += k;
    }
  }
  if (st.st_size != op->offset || replaced) {
    /* what the others appended, read under the lock: whole records only */
    off_t from = st.st_size > op->offset && !replaced ? op->offset : 0;
    size_t n = (size_t)(st.st_size - from);
    free(op->data);
    op->data = malloc(n ? n : 1);
    op->len = 0;
    op->moved = 1;
    if (!op->data) { fail(op, "read"); close(fd); return; }
    while (op->len < n) {
      ssize_t r = pread(fd, op->data + op->len, n - op->len, from + (off_t)op->len);
      if (r < 0 && errno == EINTR) continue;
      if (r <= 0) { fail(op, "read"); break; }
      op->len += (size_t)r;
    }
    close(fd);
    return;
  }
  char last = '\n';
  if (st.st_size > 0 && pread(fd, &last, 1, st.st_size - 1) != 1) {
    fail(op, "read"); close(fd); return;
  }
  if ((last != '\n' && write_all(fd, "\n", 1) < 0) || write_all(fd, op->data, op->len) < 0) {
    fail(op, "write");
    int e = op->err;
    if (ftruncate(fd, st.st_size) < 0) { /* the reader skips a torn line */ }
    op->err = e;
    close(fd);
    return;
  }
  if (fdatasync(fd) < 0) { fail(op, "fdatasync"); close(fd); return; }
  op->size = st.st_size + (off_t)op->len + (last != '\n');
  close(fd);
  if (st.st_size == 0 && fsync_dir_of(op->path) < 0) fail(op, "fsync directory of");
}

static void do_read(file_op *op) {
  int fd = open(op->path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) { fail(op, "open"); return; }
  struct stat st;
  size_t cap = 4096;
  if (fstat(fd, &st) == 0 && st.st_size > op->offset) cap = (size_t)(st.st_size - op->offset) + 1;
  if (op->offset > 0 && lseek(fd, op->offset, SEEK_SET) < 0) {
    fail(op, "seek"); close(fd); return;
  }
  char *buf = malloc(cap);
  size_t len = 0;
  if (!buf) { fail(op, "read"); close(fd); return; }
  for (;;) {
    if (len == cap) {
      char *nb = realloc(buf, cap * 2);
      if (!nb) { fail(op, "read"); free(buf); close(fd); return; }
      buf = nb;
      cap *= 2;
    }
    ssize_t r = read(fd, buf + len, cap - len);
    if (r < 0) {
      if (errno == EINTR) continue;
      fail(op, "read");
      free(buf);
      close(fd);
      return;
    }
    if (r == 0) break;
    len += (size_t)r;
  }
  close(fd);
  op->data = buf;
  op->len = len;
}

static int name_cmp(const void *a, const void *b) {
  return strcmp(*(char *const *)a, *(char *const *)b);
}

static void do_list(file_op *op) {
  DIR *d = opendir(op->path);
  if (!d) { fail(op, "open directory"); return; }
  struct dirent *e;
  errno = 0;
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    if (op->nnames == op->cap) {
      size_t nc = op->cap ? op->cap * 2 : 16;
      char **nn = realloc(op->names, nc * sizeof *nn);
      if (!nn) { fail(op, "list"); closedir(d); return; }
      op->names = nn;
      op->cap = nc;
    }
    char *s = strdup(e->d_name);
    if (!s) { fail(op, "list"); closedir(d); return; }
    op->names[op->nnames++] = s;
    errno = 0;
  }
  if (errno) fail(op, "read directory");
  closedir(d);
  if (op->nnames > 1) qsort(op->names, op->nnames, sizeof *op->names, name_cmp);
}

/* mkdir -p; every directory it creates is made durable in its parent */
static void do_mkdir(file_op *op) {
  char *p = op->path;
  size_t n = strlen(p);
  for (size_t i = 1; i <= n; i++) {
    if (p[i] != '/' && p[i] != '\0') continue;
    char c = p[i];
    p[i] = '\0';
    if (mkdir(p, 0755) == 0) {
      if (fsync_dir_of(p) < 0) {
        fail(op, "fsync parent of");
        p[i] = c;
        return;
      }
    } else if (errno != EEXIST) {
      fail(op, "mkdir");
      p[i] = c;
      return;
    }
    p[i] = c;
  }
  struct stat st;
  if (stat(p, &st) < 0) { fail(op, "mkdir"); return; }
  if (!S_ISDIR(st.st_mode)) { errno = ENOTDIR; fail(op, "mkdir"); }
}

static int remove_tree(file_op *op, const char *path) {
  struct stat st;
  if (lstat(path, &st) < 0) {
    if (errno == ENOENT) return 0;
    return fail(op, "stat");
  }
  if (!S_ISDIR(st.st_mode)) {
    if (unlink(path) < 0 && errno != ENOENT) return fail(op, "unlink");
    return 0;
  }
  DIR *d = opendir(path);
  if (!d) return fail(op, "open directory");
  struct dirent *e;
  size_t plen = strlen(path);
  while ((e = readdir(d)) != NULL) {
    if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
    size_t n = plen + strlen(e->d_name) + 2;
    char *child = malloc(n);
    if (!child) { closedir(d); return fail(op, "remove"); }
    snprintf(child, n, "%s/%s", path, e->d_name);
    int rc = remove_tree(op, child);
    free(child);
    if (rc < 0) { closedir(d); return -1; }
  }
  closedir(d);
  if (rmdir(path) < 0 && errno != ENOENT) return fail(op, "rmdir");
  return 0;
}

static void work(uv_work_t *req) {
  file_op *op = (file_op *)req->data;
  errno = 0;
  switch (op->kind) {
    case OP_WRITE: do_write(op); break;
    case OP_READ: do_read(op); break;
    case OP_LIST: do_list(op); break;
    case OP_MKDIR: do_mkdir(op); break;
    case OP_REMOVE: remove_tree(op, op->path); break;
    case OP_APPEND: do_append(op); break;
  }
}

/* ------------------------------------------------------------ loop side */

static void after_work(uv_work_t *req, int status) {
  (void)status;
  file_op *op = (file_op *)req->data;
  op->done = 1;
  if (op->cancelled) { op_free(op); return; }
  mg_wake(&op->w);
}

static void op_cancel(mg_waiter *w) {
  file_op *op = (file_op *)w;
  if (op->done) { op_free(op); return; }
  op->cancelled = 1;
  uv_cancel((uv_req_t *)&op->req);
}

/* An errno as an error code (errors.c): what is missing, refused, full
** (retryable: space can be freed) or anything else. */
static const char *errno_code(int e, int *retryable) {
  *retryable = 0;
  switch (e) {
    case ENOENT: case ENOTDIR: return "not_found";
    case EACCES: case EPERM: case EROFS: return "denied";
    case ENOSPC: case EDQUOT: *retryable = 1; return "no_space";
    case EINTR: case EAGAIN: case EIO: *retryable = 1; return "unavailable";
    default: return "failed";
  }
}

/* The message on top of the stack (the nil before it) as an error value,
** then `name`, the third value of every failure here -> 3 */
static int error_values(lua_State *L, const char *code, int retryable, const char *name) {
  mg_error_new(L, code, retryable);
  lua_pushstring(L, name);
  mg_error_detail(L, "errno");
  lua_pushstring(L, name);
  return 3;
}

static int errno_error(lua_State *L, int e) {
  int retryable;
  const char *code = errno_code(e, &retryable);
  return error_values(L, code, retryable, uv_err_name(-e));
}

static int push_error(lua_State *L, file_op *op) {
  lua_pushnil(L);
  lua_pushfstring(L, "%s %s: %s", op->what, op->path, strerror(op->err));
  return errno_error(L, op->err);
}

static int op_done(lua_State *L, int status, lua_KContext ctx) {
  (void)status;
  file_op *op = (file_op *)ctx;
  int n;
  if (op->err) {
    n = push_error(L, op);
  } else if (op->kind == OP_READ) {
    lua_pushlstring(L, op->data, op->len);
    n = 1;
  } else if (op->kind == OP_APPEND) {
    if (op->moved) {
      lua_pushboolean(L, 0);
      lua_pushinteger(L, (lua_Integer)op->size);
      lua_pushlstring(L, op->data, op->len);
      n = 3;
    } else {
      lua_pushinteger(L, (lua_Integer)op->size);
      n = 1;
    }
  } else if (op->kind == OP_LIST) {
    lua_createtable(L, (int)op->nnames, 0);
    for (size_t i = 0; i < op->nnames; i++) {
      lua_pushstring(L, op->names[i]);
      lua_rawseti(L, -2, (lua_Integer)i + 1);
    }
    n = 1;
  } else {
    lua_pushboolean(L, 1);
    n = 1;
  }
  op_free(op);
  return n;
}

static int start(lua_State *L, int kind, const char *fname) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  luaL_argcheck(L, plen > 0, 1, "empty path");
  size_t dlen = 0;
  const char *data = NULL;
  lua_Integer offset = 0;
  if (kind == OP_WRITE || kind == OP_APPEND) data = luaL_checklstring(L, 2, &dlen);
  size_t hlen = 0;
  const char *header = NULL;
  if (kind == OP_APPEND) {
    offset = luaL_checkinteger(L, 3);
    header = luaL_optlstring(L, 4, NULL, &hlen);
  }
  if (kind == OP_READ) offset = luaL_optinteger(L, 2, 0);
  luaL_argcheck(L, offset >= 0, kind == OP_READ ? 2 : 3, "negative offset");
  mg_check_yieldable(L, fname);
  file_op *op = (file_op *)calloc(1, sizeof *op);
  if (!op) return luaL_error(L, "%s: out of memory", fname);
  op->kind = kind;
  op->offset = (off_t)offset;
  op->path = strdup(path);
  if (header && hlen > 0) {
    op->header = malloc(hlen);
    if (!op->header) {
      op_free(op);
      return luaL_error(L, "%s: out of memory", fname);
    }
    memcpy(op->header, header, hlen);
    op->header_len = hlen;
  }
  if (data) {
    op->data = malloc(dlen ? dlen : 1);
    if (op->data) memcpy(op->data, data, dlen);
    op->len = dlen;
  }
  if (!op->path || (data && !op->data)) {
    op_free(op);
    return luaL_error(L, "%s: out of memory", fname);
  }
  op->req.data = op;
  int rc = uv_queue_work(mg_loop(), &op->req, work, after_work);
  if (rc < 0) {
    op_free(op);
    lua_pushnil(L);
    lua_pushfstring(L, "%s: %s", fname, uv_strerror(rc));
    return error_values(L, MG_UNAVAILABLE, uv_err_name(rc));
  }
  return mg_await(L, &op->w, op_cancel, op_done, (lua_KContext)op);
}

static int l_write(lua_State *L) { return start(L, OP_WRITE, "files.write"); }
static int l_read(lua_State *L) { return start(L, OP_READ, "files.read"); }
static int l_list(lua_State *L) { return start(L, OP_LIST, "files.list"); }
static int l_mkdir(lua_State *L) { return start(L, OP_MKDIR, "files.mkdir"); }
static int l_remove(lua_State *L) { return start(L, OP_REMOVE, "files.remove"); }
static int l_append(lua_State *L) { return start(L, OP_APPEND, "files.append"); }

/* ------------------------------------------------------------ locks */

#define LOCK_MT "moongraph.files.lock"

typedef struct { int fd; } file_lock;

static int lock_unlock(lua_State *L) {
  file_lock *lk = (file_lock *)luaL_checkudata(L, 1, LOCK_MT);
  if (lk->fd >= 0) {
    close(lk->fd);
    lk->fd = -1;
  }
  return 0;
}

static int lock_tostring(lua_State *L) {
  file_lock *lk = (file_lock *)luaL_checkudata(L, 1, LOCK_MT);
  lua_pushstring(L, lk->fd >= 0 ? "file lock (held)" : "file lock (released)");
  return 1;
}

static int l_lock(lua_State *L) {
  size_t plen;
  const char *path = luaL_checklstring(L, 1, &plen);
  luaL_argcheck(L, plen > 0, 1, "empty path");
  file_lock *lk = (file_lock *)lua_newuserdatauv(L, sizeof *lk, 0);
  lk->fd = -1;
  luaL_setmetatable(L, LOCK_MT);
  int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    int e = errno;
    lua_pushnil(L);
    lua_pushfstring(L, "open %s: %s", path, strerror(e));
    return errno_error(L, e);
  }
  if (flock(fd, LOCK_EX | LOCK_NB) < 0) {
    int e = errno;
    close(fd);
    lua_pushnil(L);
    if (e == EWOULDBLOCK) {
      lua_pushfstring(L, "lock %s: held by another process or open file", path);
      return error_values(L, "busy", 1, "EWOULDBLOCK");   /* waiting can see it let go */
    }
    lua_pushfstring(L, "lock %s: %s", path, strerror(e));
    return errno_error(L, e);
  }
  lk->fd = fd;
  return 1;
}

static const luaL_Reg lock_methods[] = {
  {"unlock", lock_unlock},
  {"__gc", lock_unlock},
  {"__close", lock_unlock},
  {"__tostring", lock_tostring},
  {NULL, NULL}
};

static const luaL_Reg file_funcs[] = {
  {"lock", l_lock},
  {"write", l_write},
  {"append", l_append},
  {"read", l_read},
  {"list", l_list},
  {"mkdir", l_mkdir},
  {"remove", l_remove},
  {NULL, NULL}
};

int mg_open_files(lua_State *L) {
  if (luaL_newmetatable(L, LOCK_MT)) {
    luaL_setfuncs(L, lock_methods, 0);
    lua_pushvalue(L, -1);
    lua_setfield(L, -2, "__index");
  }
  lua_pop(L, 1);
  luaL_newlib(L, file_funcs);
  return 1;
}
