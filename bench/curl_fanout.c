/*
** curl_fanout.c — the baseline for bench/http_fanout.lua: a bare
** libcurl-multi client with no scheduler, no Lua and no per-request objects
** beyond the easy handles.
**
**   build/curl_fanout BASE_URL fanout K ROUNDS
**       one warm-up round (opens the connections), then ROUNDS rounds of K
**       concurrent GETs of BASE_URL/delay?ms=50 on one multi handle; prints
**       "round WALL_MS CPU_US_PER_REQUEST FAILED" per round
**   build/curl_fanout BASE_URL keepalive N
**       N sequential GETs of BASE_URL/delay?ms=0 over one keep-alive
**       connection, a new easy handle each (as a client library does);
**       prints "keepalive CPU_US_PER_REQUEST WALL_US_PER_REQUEST FAILED"
** Last line: "rss PEAK_KIB".
*/
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <time.h>

#include <curl/curl.h>

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static double cpu_us(void) {
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  return (ru.ru_utime.tv_sec + ru.ru_stime.tv_sec) * 1e6 +
         ru.ru_utime.tv_usec + ru.ru_stime.tv_usec;
}

static size_t sink(char *p, size_t size, size_t n, void *ud) {
  (void)p;
  *(size_t *)ud += size * n;
  return size * n;
}

/* Run k concurrent GETs of url on multi; returns failures. */
static int fanout(CURLM *multi, const char *url, int k) {
  CURL **easy = calloc((size_t)k, sizeof *easy);
  size_t *bytes = calloc((size_t)k, sizeof *bytes);
  for (int i = 0; i < k; i++) {
    easy[i] = curl_easy_init();
    curl_easy_setopt(easy[i], CURLOPT_URL, url);
    curl_easy_setopt(easy[i], CURLOPT_WRITEFUNCTION, sink);
    curl_easy_setopt(easy[i], CURLOPT_WRITEDATA, &bytes[i]);
    curl_easy_setopt(easy[i], CURLOPT_NOSIGNAL, 1L);
    curl_multi_add_handle(multi, easy[i]);
  }
  int running = 1, failed = 0;
  while (running) {
    curl_multi_perform(multi, &running);
    if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
  }
  CURLMsg *m;
  int left;
  while ((m = curl_multi_info_read(multi, &left)))
    if (m->msg == CURLMSG_DONE && m->data.result != CURLE_OK) failed++;
  for (int i = 0; i < k; i++) {
    long status = 0;
    curl_easy_getinfo(easy[i], CURLINFO_RESPONSE_CODE, &status);
    if (status != 200) failed++;
    curl_multi_remove_handle(multi, easy[i]);
    curl_easy_cleanup(easy[i]);
  }
  free(easy);
  free(bytes);
  return failed;
}

static void usage(void) {
  fprintf(stderr, "usage: curl_fanout BASE_URL fanout K ROUNDS\n"
                  "       curl_fanout BASE_URL keepalive N\n");
  exit(2);
}

int main(int argc, char **argv) {
  if (argc < 4) usage();
  const char *base = argv[1], *mode = argv[2];
  char url[512];
  curl_global_init(CURL_GLOBAL_DEFAULT);
  CURLM *multi = curl_multi_init();

  if (!strcmp(mode, "fanout") && argc == 5) {
    int k = atoi(argv[3]), rounds = atoi(argv[4]);
    snprintf(url, sizeof url, "%s/delay?ms=50", base);
    fanout(multi, url, k);   /* warm-up: opens the connections */
    for (int r = 0; r < rounds; r++) {
      double c0 = cpu_us(), t0 = now_ms();
      int failed = fanout(multi, url, k);
      double wall = now_ms() - t0, cpu = (cpu_us() - c0) / k;
      printf("round %.2f %.2f %d\n", wall, cpu, failed);
    }
  } else if (!strcmp(mode, "keepalive") && argc == 4) {
    int n = atoi(argv[3]), failed = 0;
    snprintf(url, sizeof url, "%s/delay?ms=0", base);
    double c0 = 0, w0 = 0;
    for (int i = -100; i < n; i++) {   /* 100 warm-up requests */
      if (i == 0) { c0 = cpu_us(); w0 = now_ms(); }
      size_t bytes = 0;
      CURL *e = curl_easy_init();
      curl_easy_setopt(e, CURLOPT_URL, url);
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, sink);
      curl_easy_setopt(e, CURLOPT_WRITEDATA, &bytes);
      curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
      curl_multi_add_handle(multi, e);
      int running = 1;
      while (running) {
        curl_multi_perform(multi, &running);
        if (running) curl_multi_poll(multi, NULL, 0, 1000, NULL);
      }
      CURLMsg *m;
      int left;
      while ((m = curl_multi_info_read(multi, &left)))
        if (m->msg == CURLMSG_DONE && m->data.result != CURLE_OK) failed++;
      curl_multi_remove_handle(multi, e);
      curl_easy_cleanup(e);
    }
    printf("keepalive %.2f %.2f %d\n", (cpu_us() - c0) / n, (now_ms() - w0) * 1e3 / n, failed);
  } else {
    usage();
  }
  curl_multi_cleanup(multi);
  curl_global_cleanup();
  struct rusage ru;
  getrusage(RUSAGE_SELF, &ru);
  printf("rss %ld\n", ru.ru_maxrss);
  return 0;
}
