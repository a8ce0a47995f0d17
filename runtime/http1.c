/*
** http1.c — HTTP/1.x wire format for the server (see http1.h).
**
** The reader drives Node's http-parser with callbacks that copy the
** request-target, the headers and the body into the request being read,
** counting bytes against the limits as they arrive, and pauses the parser
** at the end of each request so that pipelined bytes stay with the caller.
** Chunked trailers are parsed (and counted) but not kept.
*/
#include "http1.h"

#include <ctype.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* http-parser's own header limit is process-wide; ours is per server and
** checked first, so theirs only needs to stay above every server's. */
static uint32_t parser_max_header = 80 * 1024;

static int fail(mg_h1_reader *r, int status, const char *reason) {
  r->status = status;
  r->reason = reason;
  return -1;
}

static int grow(char **p, size_t *cap, size_t need, size_t first) {
  if (need <= *cap) return 0;
  size_t cap2 = *cap ? *cap : first;
  while (cap2 < need) cap2 *= 2;
  char *np = realloc(*p, cap2);
  if (!np) return -1;
  *p = np;
  *cap = cap2;
  return 0;
}

#define SMALL_HEAD 512

static int head_add(mg_h1_reader *r, const char *s, size_t n, int lower) {
  mg_h1_request *q = r->req;
  if (q->head_len + n + 1 > q->head_cap) {
    if (q->head == q->small) {   /* move out of the inline space */
      char *p = malloc(q->head_cap * 2 > q->head_len + n + 1 ? q->head_cap * 2 : q->head_len + n + 1);
      if (!p) return fail(r, 503, "out of memory");
      memcpy(p, q->head, q->head_len);
      q->head_cap = q->head_cap * 2 > q->head_len + n + 1 ? q->head_cap * 2 : q->head_len + n + 1;
      q->head = p;
    } else if (grow(&q->head, &q->head_cap, q->head_len + n + 1, 256)) {
      return fail(r, 503, "out of memory");
    }
  }
  char *d = q->head + q->head_len;
  if (lower) {
    for (size_t i = 0; i < n; i++) d[i] = (char)tolower((unsigned char)s[i]);
  } else {
    memcpy(d, s, n);
  }
  q->head_len += n;
  return 0;
}

static int head_end_piece(mg_h1_reader *r) {
  return head_add(r, "", 1, 0);   /* the terminating NUL */
}

static int count_head(mg_h1_reader *r, size_t n) {
  r->head_bytes += n;
  if (r->head_bytes > r->limits->max_header)
    return fail(r, 431, "request header fields too large");
  return 0;
}

static int on_message_begin(http_parser *p) {
  mg_h1_reader *r = p->data;
  mg_h1_request *q = malloc(sizeof *q + SMALL_HEAD);
  if (!q) return fail(r, 503, "out of memory");
  memset(q, 0, sizeof *q);
  q->head = q->small;
  q->head_cap = SMALL_HEAD;
  r->req = q;
  r->head_bytes = 0;
  r->last = 0;
  r->head_complete = 0;
  return 0;
}

static int on_url(http_parser *p, const char *at, size_t n) {
  mg_h1_reader *r = p->data;
  r->head_bytes += n;
  if (r->head_bytes > r->limits->max_header)
    return fail(r, 414, "request-target too long");
  return head_add(r, at, n, 0);
}

static int on_header_field(http_parser *p, const char *at, size_t n) {
  mg_h1_reader *r = p->data;
  /* a name may come in several calls (one per read): ": " and CRLF count
  ** once, with its first piece, so how a client splits its writes does not
  ** change what fits */
  if (count_head(r, n + (r->last != 1 ? 4 : 0))) return -1;
  /* http-parser lets spaces and other non-token bytes into names */
  if (n > 0 && !mg_h1_valid_name(at, n)) return fail(r, 400, "invalid header field name");
  if (r->head_complete) {                /* a chunked trailer: not kept */
    r->last = 1;
    return 0;
  }
  mg_h1_request *q = r->req;
  if (r->last != 1) {
    if (r->last == 0) {
      q->target_len = q->head_len;
      if (head_end_piece(r)) return -1;
    } else if (head_end_piece(r)) {
      return -1;                          /* ends the previous value */
    }
    if (++q->nheaders > MG_H1_MAX_HEADERS)
      return fail(r, 431, "too many header fields");
    r->last = 1;
  }
  return head_add(r, at, n, 1);
}

static int on_header_value(http_parser *p, const char *at, size_t n) {
  mg_h1_reader *r = p->data;
  if (count_head(r, n)) return -1;
  if (r->head_complete) {
    r->last = 2;
    return 0;
  }
  if (memchr(at, '\0', n)) return fail(r, 400, "NUL in a header value");
  if (r->last == 1) {
    if (head_end_piece(r)) return -1;    /* ends the name */
    r->last = 2;
  }
  return head_add(r, at, n, 0);
}

static int ieq(const char *a, size_t n, const char *lit) {
  size_t m = strlen(lit);
  if (n != m) return 0;
  for (size_t i = 0; i < n; i++)
    if (tolower((unsigned char)a[i]) != lit[i]) return 0;
  return 1;
}

/* A Host value is uri-host [":" port] (RFC 9112 3.2, RFC 3986 3.2.2):
** a reg-name or IPv4 address, or an IP literal in brackets; empty when
** the target has no authority. */
static int valid_host(const char *s, size_t n) {
  size_t i = 0;
  if (n > 0 && s[0] == '[') {
    while (i < n && s[i] != ']') {
      unsigned char c = (unsigned char)s[i];
      if (i > 0 && !isxdigit(c) && c != ':' && c != '.') return 0;
      i++;
    }
    if (i == n) return 0;
    i++;
  } else {
    /* reg-name: unreserved, sub-delims and pct-encoded bytes */
    static unsigned char ok[256];
    if (!ok['a']) {
      for (int c = 0; c < 256; c++) ok[c] = isalnum(c) != 0;
      for (const char *e = "-._~!$&'()*+,;=%"; *e; e++) ok[(unsigned char)*e] = 1;
    }
    while (i < n && s[i] != ':') {
      if (!ok[(unsigned char)s[i]]) return 0;
      i++;
    }
  }
  if (i == n) return 1;
  if (s[i] != ':') return 0;
  for (i++; i < n; i++)
    if (!isdigit((unsigned char)s[i])) return 0;
  return 1;
}

static int check_host(mg_h1_reader *r, const mg_h1_request *q, const http_parser *p) {
  size_t pos = 0, vlen, hlen = 0;
  const char *name, *value, *host = NULL;
  int n = 0;
  while (mg_h1_next_header(q, &pos, &name, &value, &vlen)) {
    if (strcmp(name, "host") == 0) {
      n++;
      host = value;
      hlen = vlen;
    }
  }
  if (n > 1) return fail(r, 400, "more than one Host header");
  if (n == 0 && p->http_minor >= 1) return fail(r, 400, "an HTTP/1.1 request needs a Host header");
  if (host && !valid_host(host, hlen)) return fail(r, 400, "invalid Host header");
  return 0;
}

static int on_headers_complete(http_parser *p) {
  mg_h1_reader *r = p->data;
  mg_h1_request *q = r->req;
  if (r->last == 0) {
    q->target_len = q->head_len;
    if (head_end_piece(r)) return -1;
  } else if (r->last == 2) {
    if (head_end_piece(r)) return -1;
  }
  r->last = 3;
  r->head_complete = 1;
  if (p->http_major != 1) return fail(r, 505, "HTTP version not supported");
  if (check_host(r, q, p)) return -1;
  q->method = p->method;
  q->major = p->http_major;
  q->minor = p->http_minor;
  q->keep_alive = http_should_keep_alive(p) ? 1 : 0;
  q->chunked = (p->flags & F_CHUNKED) ? 1 : 0;
  q->upgrade = p->upgrade ? 1 : 0;
  if (q->upgrade) q->keep_alive = 0;
  int has_length = (p->flags & F_CONTENTLENGTH) != 0;
  if (has_length && p->content_length > r->limits->max_body)
    return fail(r, 413, "request body too large");
  if (q->chunked || (has_length && p->content_length > 0)) {
    size_t vlen;
    const char *v = mg_h1_header(q, "expect", &vlen);
    if (v && ieq(v, vlen, "100-continue")) q->expect_continue = 1;
    if (has_length && !q->chunked &&
        grow(&q->body, &q->body_cap, (size_t)p->content_length, 1))
      return fail(r, 503, "out of memory");
  }
  return 0;
}

/* The CRLF that ends a chunk's data, seen in [from, end); what is not
** there yet is checked at the start of the next feed. (http-parser, built
** non-strict, takes any two bytes there.) */
static int check_crlf(mg_h1_reader *r, const char *from, const char *end) {
  while (r->crlf_need > 0 && from < end) {
    if (*from != (r->crlf_need == 2 ? '\r' : '\n'))
      return fail(r, 400, "chunk data not followed by CRLF");
    from++;
    r->crlf_need--;
  }
  return 0;
}

static int on_body(http_parser *p, const char *at, size_t n) {
  mg_h1_reader *r = p->data;
  mg_h1_request *q = r->req;
  if (q->body_len + n > r->limits->max_body)
    return fail(r, 413, "request body too large");
  if (grow(&q->body, &q->body_cap, q->body_len + n, 4096))
    return fail(r, 503, "out of memory");
  memcpy(q->body + q->body_len, at, n);
  q->body_len += n;
  /* the chunk's last data: the parser stands on the byte after it */
  if ((p->flags & F_CHUNKED) && p->content_length == 0) {
    r->crlf_need = 2;
    return check_crlf(r, at + n, r->feed_end);
  }
  return 0;
}

static int on_message_complete(http_parser *p) {
  mg_h1_reader *r = p->data;
  r->done = r->req;
  r->req = NULL;
  r->head_complete = 0;
  r->last = 0;
  http_parser_pause(p, 1);
  return 0;
}

static const http_parser_settings settings = {
  .on_message_begin = on_message_begin,
  .on_url = on_url,
  .on_header_field = on_header_field,
  .on_header_value = on_header_value,
  .on_headers_complete = on_headers_complete,
  .on_body = on_body,
  .on_message_complete = on_message_complete,
};

void mg_h1_reader_init(mg_h1_reader *r, const mg_h1_limits *limits) {
  memset(r, 0, sizeof *r);
  http_parser_init(&r->parser, HTTP_REQUEST);
  r->parser.data = r;
  r->limits = limits;
  if (limits->max_header + 1024 > parser_max_header) {
    parser_max_header = (uint32_t)(limits->max_header + 1024);
    http_parser_set_max_header_size(parser_max_header);
  }
}

int mg_h1_feed(mg_h1_reader *r, const char *data, size_t len, size_t *used) {
  *used = 0;
  if (r->failed || r->done) return MG_H1_ERROR;
  if (len == 0) return MG_H1_MORE;   /* 0 would tell the parser "EOF" */
  if (r->crlf_need && check_crlf(r, data, data + len)) {
    r->failed = 1;
    return MG_H1_ERROR;
  }
  r->feed_end = data + len;
  http_parser_pause(&r->parser, 0);
  size_t n = http_parser_execute(&r->parser, &settings, data, len);
  enum http_errno e = HTTP_PARSER_ERRNO(&r->parser);
  *used = n;
  if (e == HPE_PAUSED && r->done) return MG_H1_REQUEST;
  if (e == HPE_OK) {
    if (r->done) return MG_H1_REQUEST;   /* an upgrade request ends parsing */
    return MG_H1_MORE;
  }
  r->failed = 1;
  if (!r->status) {
    switch (e) {
      case HPE_HEADER_OVERFLOW:
        r->status = 431;
        r->reason = "request header fields too large";
        break;
      case HPE_INVALID_VERSION:
        r->status = 505;
        r->reason = "HTTP version not supported";
        break;
      default:
        r->status = 400;
        r->reason = http_errno_description(e);
    }
  }
  return MG_H1_ERROR;
}

mg_h1_request *mg_h1_take(mg_h1_reader *r) {
  mg_h1_request *q = r->done;
  r->done = NULL;
  return q;
}

int mg_h1_in_head(const mg_h1_reader *r) {
  return r->req != NULL && !r->head_complete;
}

int mg_h1_in_body(const mg_h1_reader *r) {
  return r->req != NULL && r->head_complete;
}

int mg_h1_wants_continue(const mg_h1_reader *r) {
  return r->req != NULL && r->head_complete && r->req->expect_continue &&
         r->req->body_len == 0;
}

void mg_h1_reader_free(mg_h1_reader *r) {
  mg_h1_request_free(r->req);
  mg_h1_request_free(r->done);
  r->req = r->done = NULL;
}

void mg_h1_request_free(mg_h1_request *q) {
  if (!q) return;
  if (q->head != q->small) free(q->head);
  free(q->body);
  free(q);
}

const char *mg_h1_method(const mg_h1_request *q) {
  return http_method_str((enum http_method)q->method);
}

int mg_h1_next_header(const mg_h1_request *q, size_t *pos, const char **name,
                      const char **value, size_t *vlen) {
  size_t p = *pos ? *pos : q->target_len + 1;
  if (p >= q->head_len) return 0;
  *name = q->head + p;
  p += strlen(*name) + 1;
  if (p > q->head_len) return 0;
  *value = q->head + p;
  *vlen = strlen(*value);
  *pos = p + *vlen + 1;
  return 1;
}

const char *mg_h1_header(const mg_h1_request *q, const char *lname, size_t *len) {
  size_t pos = 0;
  const char *name, *value;
  size_t vlen;
  while (mg_h1_next_header(q, &pos, &name, &value, &vlen)) {
    if (strcmp(name, lname) == 0) {
      if (len) *len = vlen;
      return value;
    }
  }
  return NULL;
}

/* ------------------------------------------------------------- writing */

const char *mg_h1_reason(int status) {
  switch (status) {
#define XX(num, name, string) case num: return #string;
    HTTP_STATUS_MAP(XX)
#undef XX
    default: return "Unknown";
  }
}

int mg_h1_bodyless(int status) {
  return (status >= 100 && status < 200) || status == 204 || status == 304;
}

int mg_h1_valid_name(const char *s, size_t n) {
  static const char *extra = "!#$%&'*+-.^_`|~";
  if (n == 0) return 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char c = (unsigned char)s[i];
    if (!isalnum(c) && (c == 0 || !strchr(extra, c))) return 0;
  }
  return 1;
}

int mg_h1_valid_value(const char *s, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (s[i] == '\r' || s[i] == '\n' || s[i] == '\0') return 0;
  return 1;
}

static const char *const wdays[] = {"Sun", "Mon", "Tue", "Wed", "Thu", "Fri", "Sat"};
static const char *const months[] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun",
                                      "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

size_t mg_h1_http_date(char *buf, int64_t t) {
  time_t tt = (time_t)t;
  struct tm tm;
  gmtime_r(&tt, &tm);
  return (size_t)snprintf(buf, 30, "%s, %02d %s %04d %02d:%02d:%02d GMT",
                          wdays[tm.tm_wday], tm.tm_mday, months[tm.tm_mon],
                          tm.tm_year + 1900, tm.tm_hour, tm.tm_min, tm.tm_sec);
}

size_t mg_h1_date_line(char *buf) {
  static time_t cached_at = -1;
  static char cached[40];
  static size_t cached_len;
  time_t now = time(NULL);
  if (now != cached_at) {
    memcpy(cached, "Date: ", 6);
    size_t n = mg_h1_http_date(cached + 6, now);
    memcpy(cached + 6 + n, "\r\n", 2);
    cached_len = 6 + n + 2;
    cached_at = now;
  }
  memcpy(buf, cached, cached_len);
  return cached_len;
}

static int num(const char *s, int n) {
  int v = 0;
  for (int i = 0; i < n; i++) {
    if (!isdigit((unsigned char)s[i])) return -1;
    v = v * 10 + (s[i] - '0');
  }
  return v;
}

int64_t mg_h1_parse_date(const char *s, size_t n) {
  /* "Sun, 06 Nov 1994 08:49:37 GMT" */
  if (n != 29 || s[3] != ',' || s[4] != ' ' || s[7] != ' ' || s[11] != ' ' ||
      s[16] != ' ' || s[19] != ':' || s[22] != ':' || memcmp(s + 25, " GMT", 4))
    return -1;
  int mon = -1;
  for (int i = 0; i < 12; i++)
    if (memcmp(s + 8, months[i], 3) == 0) mon = i;
  int day = num(s + 5, 2), year = num(s + 12, 4);
  int hh = num(s + 17, 2), mm = num(s + 20, 2), ss = num(s + 23, 2);
  if (mon < 0 || day < 1 || day > 31 || year < 1970 || hh < 0 || hh > 23 ||
      mm < 0 || mm > 59 || ss < 0 || ss > 60)
    return -1;
  /* days from civil (Howard Hinnant's algorithm) */
  int y = year - (mon < 2);
  int era = y / 400;
  int yoe = y - era * 400;
  int m = mon + 1;
  int doy = (153 * (m + (m > 2 ? -3 : 9)) + 2) / 5 + day - 1;
  int doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
  int64_t days = (int64_t)era * 146097 + doe - 719468;
  return days * 86400 + hh * 3600 + mm * 60 + ss;
}
