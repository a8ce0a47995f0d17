/*
** sse.h — incremental Server-Sent Events parser.
**
** The parser follows the WHATWG "event stream interpretation" rules: a
** leading UTF-8 BOM is dropped, lines end in CRLF, LF or CR, a line starting
** with ':' is a comment, `data:` lines accumulate (joined by LF), `event:`
** names the event, `id:` sets the last event id (ignored when it contains a
** NUL), `retry:` sets the reconnection time when it is all ASCII digits, and
** an empty line dispatches the event (nothing when no data was given).
**
** Bytes may be fed in chunks split anywhere — inside a field name, between
** CR and LF, inside the BOM — and produce exactly the events that feeding the
** whole stream at once produces. Memory use is bounded by `max_bytes`: a line
** or an event's data longer than that puts the parser in an error state.
*/
#ifndef MG_SSE_H
#define MG_SSE_H

#include <stddef.h>

#define MG_SSE_OK 0
#define MG_SSE_ETOOBIG -1   /* a line or an event exceeded max_bytes */
#define MG_SSE_ENOMEM -2    /* allocation failed */
#define MG_SSE_ESTOP -3     /* the callback asked to stop */

#define MG_SSE_DEFAULT_MAX (16u * 1024u * 1024u)

typedef struct mg_sse_buf {
  char *p;
  size_t len, cap;
} mg_sse_buf;

/* One dispatched event. Strings are not NUL-terminated (data may contain
** NUL bytes); they stay valid only during the callback. */
typedef struct mg_sse_event {
  const char *event; size_t event_len;   /* "message" when not given */
  const char *data;  size_t data_len;    /* trailing LF removed */
  const char *id;    size_t id_len;      /* last event id; id_len 0 = none */
  long retry;       /* ms from a retry: field in this event's block, or -1 */
} mg_sse_event;

/* Return 0 to go on, anything else to stop feed() with MG_SSE_ESTOP. */
typedef int (*mg_sse_cb)(void *ud, const mg_sse_event *ev);

typedef struct mg_sse {
  mg_sse_buf line, data, event, id;
  size_t max_bytes;
  long retry;            /* reconnection time (ms), -1 until a retry: field */
  long block_retry;      /* retry: seen since the last dispatch, or -1 */
  unsigned char bom;     /* BOM bytes matched so far; 3 = past the start */
  unsigned char cr;      /* last byte was CR: skip a following LF */
  int error;             /* sticky MG_SSE_E* once failed */
} mg_sse;

/* max_bytes 0 means MG_SSE_DEFAULT_MAX. */
void mg_sse_init(mg_sse *p, size_t max_bytes);

/* Parse len bytes, calling cb for each complete event. Returns MG_SSE_OK or a
** negative MG_SSE_E* code; after an error every further feed returns it until
** mg_sse_reset(). */
int mg_sse_feed(mg_sse *p, const char *buf, size_t len, mg_sse_cb cb, void *ud);

/* Forget everything (pending line, data, event, last id, retry, error) as if
** a new stream began. Keeps max_bytes and allocated memory. */
void mg_sse_reset(mg_sse *p);

/* Release the buffers. The parser can be initialised again afterwards. */
void mg_sse_free(mg_sse *p);

const char *mg_sse_strerror(int code);

#endif
