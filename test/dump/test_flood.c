/* test_flood.c — hostile clients: 10^5 requests of every bad kind from a
 * child process, with silent connections held open, while the host's
 * allocation latency stays bounded and every request that must be answered
 * is. Helpers: dump_test.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "driver_host.h"
#include "dump_test.h"
#include "json.h"
#include "protocol.h"
#include "vpmm.h"

#define FLOOD_REQUESTS 100000

/* A buffered line reader: replies of the flood are read in bulk. */
struct reader {
	int fd;
	char buf[1 << 16];
	size_t off, len;
};

/* true: a whole line was consumed (its start copied into `head`). */
static bool next_line(struct reader *r, char *head, size_t n)
{
	size_t h = 0;
	for (;;) {
		if (r->off == r->len) {
			ssize_t got;
			do
				got = recv(r->fd, r->buf, sizeof(r->buf), 0);
			while (got < 0 && errno == EINTR);
			if (got <= 0)
				return false;
			r->off = 0;
			r->len = (size_t)got;
		}
		char *nl = memchr(r->buf + r->off, '\n', r->len - r->off);
		size_t take = nl ? (size_t)(nl - (r->buf + r->off)) : r->len - r->off;
		size_t copy = take < n - 1 - h ? take : n - 1 - h;
		memcpy(head + h, r->buf + r->off, copy);
		h += copy;
		head[h] = '\0';
		r->off += take;
		if (nl) {
			r->off++;
			return true;
		}
	}
}

/* The flooder (a child process): FLOOD_REQUESTS requests of every bad kind.
 * Exits 0 if every request that must be answered was, 1 otherwise. */
static void flood(const char *path)
{
	long sent = 0, unanswered = 0, busy = 0, failed_dials = 0;
	int stuck[6] = { -1, -1, -1, -1, -1, -1 };
	static struct reader rd;
	char head[256];
	prctl(PR_SET_PDEATHSIG, SIGKILL); /* never outlive the test */
	if (getppid() == 1)
		_exit(1);
	while (sent < FLOOD_REQUESTS) {
		/* a few silent connections held at all times */
		int si = (int)(rnd() % 6);
		if (stuck[si] >= 0)
			close(stuck[si]);
		stuck[si] = dial(path);

		int fd = dial(path);
		if (fd < 0) {
			if (++failed_dials > 100)
				break; /* the server is gone: report, don't spin */
			unanswered++;
			sent++;
			continue;
		}
		rd.fd = fd;
		rd.off = rd.len = 0;
		uint32_t kind = rnd() % 8;
		char buf[VPMM_REQUEST_MAX * 2];
		if (kind <= 3) { /* 100 pipelined lines, a mix of good and bad */
			size_t len = 0;
			int lines = 100;
			for (int i = 0; i < lines; i++) {
				static const char *const reqs[] = {
					"vpmm 1 ping\n", "vpmm 1 stats\n", "vpmm 1 map\n",
					"vpmm 1 nosuch\n", "junk junk\n", "vpmm 1 trace bogus\n",
					"vpmm 1 config\n",
				};
				if (rnd() % 4 == 0) { /* random bytes, then a newline */
					size_t n = 1 + rnd() % 60;
					for (size_t k = 0; k < n; k++) {
						char ch = (char)(rnd() & 0xff);
						buf[len++] = ch == '\n' ? 'x' : ch;
					}
					buf[len++] = '\n';
				} else {
					const char *q = reqs[rnd() % 7];
					memcpy(buf + len, q, strlen(q));
					len += strlen(q);
				}
			}
			if (!send_all(fd, buf, len)) {
				/* A server at its client limit refuses at once and
				 * closes, maybe before the batch is all sent: the
				 * refusal is still there to read. */
				if (next_line(&rd, head, sizeof(head)) && strstr(head, "busy"))
					busy++;
				else
					unanswered += lines;
			} else {
				for (int i = 0; i < lines; i++) {
					if (!next_line(&rd, head, sizeof(head))) {
						unanswered += lines - i;
						break;
					}
					bool refused = i == 0 && strstr(head, "busy");
					if (refused)
						busy++; /* turned away whole: fine */
					else if (strncmp(head, "{\"protocol\":1,", 14) != 0)
						unanswered++;
					if (refused)
						break;
				}
			}
			sent += lines;
		} else if (kind == 4) { /* oversized */
			memset(buf, 'A' + (int)(rnd() % 26), sizeof(buf));
			send_all(fd, buf, VPMM_REQUEST_MAX + 1 + rnd() % VPMM_REQUEST_MAX);
			if (!next_line(&rd, head, sizeof(head)) ||
			    (!strstr(head, "too long") && !strstr(head, "busy")))
				unanswered++;
			sent++;
		} else if (kind == 5) { /* truncated: part of a line, then gone */
			const char *q = "vpmm 1 map\n";
			send_all(fd, q, 1 + rnd() % (strlen(q) - 1));
			sent++;
		} else if (kind == 6) { /* never reads its replies */
			for (int i = 0; i < 50; i++)
				send(fd, "vpmm 1 map\n", 11, MSG_NOSIGNAL | MSG_DONTWAIT);
			sent += 50;
		} else { /* wrong version: answered, then closed */
			const char *q = "vpmm 7 map\n";
			send_all(fd, q, strlen(q));
			if (!next_line(&rd, head, sizeof(head)) ||
			    (!strstr(head, "protocol version 7") && !strstr(head, "busy")))
				unanswered++;
			sent++;
		}
		close(fd);
	}
	for (int i = 0; i < 6; i++)
		if (stuck[i] >= 0)
			close(stuck[i]);
	fprintf(stderr, "flood: %ld requests, %ld unanswered, %ld busy\n", sent, unanswered, busy);
	_exit(unanswered == 0 && sent >= FLOOD_REQUESTS ? 0 : 1);
}

static uint64_t ns_now(void)
{
	struct timespec ts;
	clock_gettime(CLOCK_MONOTONIC, &ts);
	return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

Test(dump, hostile_clients_never_stall_allocations)
{
	TEST_DEADLINE(240);
	struct host h;
	/* Clients silent or not reading for 1 s are dropped: long enough for a
	 * flooder that a loaded machine stalls a while, short enough that the
	 * silent ones it keeps open are cycled out during the test. */
	host_open(&h, "flood.sock", 1000, 1 << 16);
	/* a pool with hundreds of regions: map replies of tens of KB */
	CUstream s = vpmm_host_stream_create(h.drv);
	CUdeviceptr keep[600];
	for (int i = 0; i < 600; i++)
		keep[i] = alloc(&h, 1, s);
	for (int i = 0; i < 600; i += 2)
		cr_assert_eq(vpmm_pool_free(h.pool, keep[i], s), 0);

	pid_t child = fork();
	cr_assert_geq(child, 0);
	if (child == 0)
		flood(h.sock);

	uint64_t worst = 0, ops = 0;
	int st = 0;
	for (;;) {
		pid_t w = waitpid(child, &st, WNOHANG);
		if (w == child)
			break;
		for (int i = 0; i < 100; i++) {
			CUdeviceptr p;
			uint64_t t0 = ns_now();
			int rc = vpmm_pool_malloc(h.pool, PAGE, s, &p);
			uint64_t t1 = ns_now();
			cr_assert_eq(rc, 0);
			cr_assert_eq(vpmm_pool_free(h.pool, p, s), 0);
			uint64_t t2 = ns_now();
			if (t1 - t0 > worst)
				worst = t1 - t0;
			if (t2 - t1 > worst)
				worst = t2 - t1;
			ops += 2;
		}
		struct timespec nap = { 0, 1000000 };
		nanosleep(&nap, NULL);
	}
	cr_assert(WIFEXITED(st), "the flooder died of signal %d", WTERMSIG(st));
	cr_assert_eq(WEXITSTATUS(st), 0, "some well-formed requests got no reply");
	cr_log_info("allocation latency during the flood: worst %.3f ms over %" PRIu64 " ops",
		    (double)worst / 1e6, ops);
	cr_assert_gt(ops, 0);
	cr_assert_lt(worst, 50 * 1000000ull, "an allocation took %.1f ms during the flood",
		     (double)worst / 1e6);
	/* still serving, and it still answers correctly */
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 map\n", &r));
	cr_assert(reply_ok(&r));
	const struct json *pools = json_get(&r, "pools");
	struct vpmm_stats stats;
	vpmm_pool_stats(h.pool, &stats);
	cr_assert_eq(json_get(&pools->items[0], "regions")->n, stats.regions);
	json_free(&r);
	close(fd);
	host_close(&h);
}
