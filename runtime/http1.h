/*
** http1.h — HTTP/1.x wire format for the server: reading requests (on
** Node's http-parser) under size limits, and writing response heads and
** chunks.
**
** Pure code: no libuv, no Lua, no allocation beyond the request being read,
** so the reader can be fuzzed on its own (fuzz/http1_fuzz.c).
**
** Reading. A connection owns one mg_h1_reader and feeds it the bytes it
** receives, in pieces of any size:
**
**   mg_h1_reader_init(&r, &limits);
**   int ev = mg_h1_feed(&r, data, len, &used);
**
** mg_h1_feed consumes bytes up to the end of one request and stops there:
**   MG_H1_MORE     all `len` bytes were used and the request is not complete
**                  (mg_h1_in_head / mg_h1_in_body tell which part is awaited)
**   MG_H1_REQUEST  a whole request was read; `used` bytes belong to it, the
**                  rest belongs to the next one (pipelining). Take it with
**                  mg_h1_take() before feeding again.
**   MG_H1_ERROR    the request is malformed or over a limit: answer
**                  r.status (400, 413, 414, 431, 505) with r.reason and close
**                  the connection; the reader must not be fed again.
**
** What RFC 9112 says a server must refuse is refused (400), beyond what
** http-parser checks in the non-strict build distributions ship: an
** HTTP/1.1 request without a Host header, any request with two, a Host
** value that is not a host[:port], and chunk data not followed by CRLF.
**
** Limits (mg_h1_limits): max_header bounds the request line plus header
** lines in bytes (431; a request-target alone over it is 414), at most
** MG_H1_MAX_HEADERS header lines (431); max_body bounds the body in bytes
** whether sent with Content-Length (refused before it is read) or chunked
** (413).
**
** A request (mg_h1_request) owns its bytes: the request-target and the
** headers in one block (names lower-cased), the body in another. It stays
** valid after the reader moves on, until mg_h1_request_free().
*/
#ifndef MG_HTTP1_H
#define MG_HTTP1_H

#include <stddef.h>
#include <stdint.h>

#include <http_parser.h>

#define MG_H1_MAX_HEADERS 100

typedef struct {
  size_t max_header;          /* request line + headers, bytes */
  size_t max_body;            /* body bytes */
} mg_h1_limits;

typedef struct {
  unsigned method;            /* enum http_method */
  unsigned short major, minor;
  unsigned keep_alive : 1;    /* the client allows a next request */
  unsigned chunked : 1;       /* the body came chunked */
  unsigned expect_continue : 1;
  unsigned upgrade : 1;       /* Upgrade was asked (not supported: closes) */
  /* head: target "\0" then nheaders times name "\0" value "\0" */
  char *head;
  size_t head_len, head_cap;
  size_t target_len;
  int nheaders;
  char *body;
  size_t body_len, body_cap;
  char small[];               /* head starts here (one allocation) */
} mg_h1_request;

enum { MG_H1_MORE, MG_H1_REQUEST, MG_H1_ERROR };

typedef struct {
  http_parser parser;
  const mg_h1_limits *limits;
  mg_h1_request *req;         /* being read; NULL before its first byte */
  mg_h1_request *done;        /* read, waiting for mg_h1_take */
  size_t head_bytes;
  int last;                   /* last header callback: 0 none, 1 name, 2 value */
  int head_complete;
  int failed;
  int crlf_need;              /* bytes of the CRLF after chunk data still to see */
  const char *feed_end;       /* end of the bytes being fed */
  int status;                 /* with MG_H1_ERROR: the status to answer */
  const char *reason;         /* and a short explanation for the body */
} mg_h1_reader;

void mg_h1_reader_init(mg_h1_reader *r, const mg_h1_limits *limits);
int mg_h1_feed(mg_h1_reader *r, const char *data, size_t len, size_t *used);
/* The request mg_h1_feed completed (the caller owns it now), or NULL. */
mg_h1_request *mg_h1_take(mg_h1_reader *r);
/* A request has started (some of its bytes arrived) but its head is not
** complete / its body is not complete. */
int mg_h1_in_head(const mg_h1_reader *r);
int mg_h1_in_body(const mg_h1_reader *r);
/* The request being read expects "100 Continue" before its body. */
int mg_h1_wants_continue(const mg_h1_reader *r);
/* Free whatever the reader holds (it can be initialised again). */
void mg_h1_reader_free(mg_h1_reader *r);

void mg_h1_request_free(mg_h1_request *q);
const char *mg_h1_method(const mg_h1_request *q);
/* The value of header `lname` (lower-case), or NULL; repeated headers give
** the first one. *len gets its length. */
const char *mg_h1_header(const mg_h1_request *q, const char *lname, size_t *len);
/* Iterate headers: start with *pos = 0; returns 0 at the end. */
int mg_h1_next_header(const mg_h1_request *q, size_t *pos, const char **name,
                      const char **value, size_t *vlen);

/* Writing. */
const char *mg_h1_reason(int status);
/* A status that never has a body (1xx, 204, 304). */
int mg_h1_bodyless(int status);
/* Header names are tokens; values have no CR, LF or NUL. */
int mg_h1_valid_name(const char *s, size_t n);
int mg_h1_valid_value(const char *s, size_t n);
/* Write "Date: <IMF-fixdate>\r\n" for the current second into buf (>= 40
** bytes); returns its length. */
size_t mg_h1_date_line(char *buf);
/* Format t (seconds since the epoch) as an IMF-fixdate into buf (>= 30). */
size_t mg_h1_http_date(char *buf, int64_t t);
/* Parse an IMF-fixdate; -1 when it is not one. */
int64_t mg_h1_parse_date(const char *s, size_t n);

#endif
