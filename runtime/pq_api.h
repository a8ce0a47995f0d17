/*
** pq_api.h — libpq, opened on first use (lazylib.h says why).
**
** Include this instead of <libpq-fe.h>: the PQ* functions below become calls
** through the table `mg_pq`, which mg_pq_load() fills. Call it before the
** first of them (before a connection exists); it is cheap once loaded.
*/
#ifndef MG_PQ_API_H
#define MG_PQ_API_H

#include <libpq-fe.h>

#define MG_PQ_FUNCS(X) \
  X(PQbackendPID) X(PQcancel) X(PQclear) X(PQcmdTuples) \
  X(PQconnectPoll) X(PQconnectStart) X(PQconsumeInput) X(PQerrorMessage) \
  X(PQfinish) X(PQflush) X(PQfname) X(PQfreeCancel) \
  X(PQfreemem) X(PQftype) X(PQgetCancel) X(PQgetCopyData) \
  X(PQgetResult) X(PQgetisnull) X(PQgetlength) X(PQgetvalue) \
  X(PQisBusy) X(PQnfields) X(PQntuples) X(PQputCopyEnd) \
  X(PQresStatus) X(PQresultErrorField) X(PQresultErrorMessage) X(PQresultStatus) \
  X(PQsendPrepare) X(PQsendQuery) X(PQsendQueryParams) X(PQsendQueryPrepared) X(PQsetNoticeProcessor) X(PQsetnonblocking) \
  X(PQsocket) X(PQstatus) X(PQtransactionStatus) X(PQunescapeBytea) \
  X(PQenterPipelineMode) X(PQexitPipelineMode) X(PQpipelineSync)

struct mg_pq_api {
#define MG_PQ_SLOT(f) __typeof__(f) *f;
  MG_PQ_FUNCS(MG_PQ_SLOT)
#undef MG_PQ_SLOT
};
extern struct mg_pq_api mg_pq;

/* NULL once libpq is loaded, else why it cannot be. */
const char *mg_pq_load(void);

#ifndef MG_PQ_API_IMPL
#define PQbackendPID mg_pq.PQbackendPID
#define PQcancel mg_pq.PQcancel
#define PQclear mg_pq.PQclear
#define PQcmdTuples mg_pq.PQcmdTuples
#define PQconnectPoll mg_pq.PQconnectPoll
#define PQconnectStart mg_pq.PQconnectStart
#define PQconsumeInput mg_pq.PQconsumeInput
#define PQerrorMessage mg_pq.PQerrorMessage
#define PQfinish mg_pq.PQfinish
#define PQflush mg_pq.PQflush
#define PQfname mg_pq.PQfname
#define PQfreeCancel mg_pq.PQfreeCancel
#define PQfreemem mg_pq.PQfreemem
#define PQftype mg_pq.PQftype
#define PQgetCancel mg_pq.PQgetCancel
#define PQgetCopyData mg_pq.PQgetCopyData
#define PQgetResult mg_pq.PQgetResult
#define PQgetisnull mg_pq.PQgetisnull
#define PQgetlength mg_pq.PQgetlength
#define PQgetvalue mg_pq.PQgetvalue
#define PQisBusy mg_pq.PQisBusy
#define PQnfields mg_pq.PQnfields
#define PQntuples mg_pq.PQntuples
#define PQputCopyEnd mg_pq.PQputCopyEnd
#define PQresStatus mg_pq.PQresStatus
#define PQresultErrorField mg_pq.PQresultErrorField
#define PQresultErrorMessage mg_pq.PQresultErrorMessage
#define PQresultStatus mg_pq.PQresultStatus
#define PQsendPrepare mg_pq.PQsendPrepare
#define PQsendQuery mg_pq.PQsendQuery
#define PQsendQueryParams mg_pq.PQsendQueryParams
#define PQsendQueryPrepared mg_pq.PQsendQueryPrepared
#define PQsetNoticeProcessor mg_pq.PQsetNoticeProcessor
#define PQsetnonblocking mg_pq.PQsetnonblocking
#define PQsocket mg_pq.PQsocket
#define PQstatus mg_pq.PQstatus
#define PQtransactionStatus mg_pq.PQtransactionStatus
#define PQunescapeBytea mg_pq.PQunescapeBytea
#define PQenterPipelineMode mg_pq.PQenterPipelineMode
#define PQexitPipelineMode mg_pq.PQexitPipelineMode
#define PQpipelineSync mg_pq.PQpipelineSync
#endif

#endif
