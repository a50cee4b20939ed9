/* test_protocol.c — the dump suite's protocol cases: the project's version
 * in replies and --version, protocol errors answered, a client that stops
 * writing, a gone process, a stale socket and another protocol version as
 * clear failures, untrusted replies and bad option values, the trim
 * request reaching its hook, and 4 000 requests made at random.
 * Helpers: dump_test.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include "dump_test.h"
#include "json.h"
#include "protocol.h"
#include "server.h"
#include "trace.h"
#include "vpmm.h"
#include "vpmm/version.h"

/* ---- protocol ------------------------------------------------------------------- */

/* The version of the project's meson.build reaches the socket's replies and
 * both tools' --version. */
Test(dump, version_is_the_projects)
{
	struct host h;
	host_open(&h, "v.sock", 0, 64);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 version\n", &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "library")), VPMM_VERSION);
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 config\n", &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "library")), VPMM_VERSION);
	json_free(&r);
	close(fd);
	host_close(&h);

	char want[128];
	struct run run_out;
	run((char *[]){ VPMM_DUMP, "--version", NULL }, &run_out);
	snprintf(want, sizeof(want), "vpmm-dump %s (socket protocol %d)\n", VPMM_VERSION,
		 VPMM_PROTOCOL);
	cr_assert_eq(run_out.status, 0, "%s", run_out.err);
	cr_assert_str_eq(run_out.out, want);
	run_free(&run_out);
	run((char *[]){ VPMM_REPLAY, "--version", NULL }, &run_out);
	snprintf(want, sizeof(want), "vpmm-replay %s\n", VPMM_VERSION);
	cr_assert_eq(run_out.status, 0, "%s", run_out.err);
	cr_assert_str_eq(run_out.out, want);
	run_free(&run_out);
}

Test(dump, protocol_errors_are_answered)
{
	struct host h;
	host_open(&h, "p.sock", 0, 64);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	struct json r;

	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	cr_assert(reply_ok(&r));
	int64_t v = 0, pid = 0;
	cr_assert(json_i64(json_get(&r, "protocol"), &v));
	cr_assert_eq(v, VPMM_PROTOCOL);
	cr_assert(json_i64(json_get(&r, "pid"), &pid));
	cr_assert_eq(pid, getpid());
	json_free(&r);

	/* malformed requests: an error each, the connection stays usable */
	const char *bad[] = { "hello\n", "vpmm\n", "vpmm x map\n", "vpmm 1\n", "vpmm 1 nosuch\n",
			      "vpmm 1 map\x01\n", "\xff\xfe\n", "\n", "vpmm -1 map\n" };
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
		cr_assert(exchange(fd, bad[i], &r), "no reply to bad request %zu", i);
		cr_assert_not(reply_ok(&r), "bad request %zu accepted", i);
		cr_assert_not_null(json_str(json_get(&r, "error")));
		json_free(&r);
	}
	cr_assert(exchange(fd, "vpmm 1 stats\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	/* pipelined */
	const char *three = "vpmm 1 ping\nvpmm 1 version\nvpmm 1 help\n";
	cr_assert(send_all(fd, three, strlen(three)));
	for (int i = 0; i < 3; i++) {
		char *line = read_line(fd);
		cr_assert_not_null(line);
		cr_assert_not_null(strstr(line, "\"ok\":true"), "%s", line);
		if (i == 2)
			cr_assert(strstr(line, "trim") && strstr(line, "trace"), "%s", line);
		free(line);
	}
	/* hooks: trim has none here; trace is wired to trace.c */
	cr_assert(exchange(fd, "vpmm 1 trim 1M\n", &r));
	cr_assert_not(reply_ok(&r));
	cr_assert_not_null(strstr(json_str(json_get(&r, "error")), "unsupported"));
	json_free(&r);
	char req[256], path[128];
	snprintf(path, sizeof(path), "%s/t.csv", h.dir);
	snprintf(req, sizeof(req), "vpmm 1 trace start %s\n", path);
	cr_assert(exchange(fd, req, &r));
	cr_assert(reply_ok(&r), "trace start refused");
	bool active = false;
	cr_assert(json_bool(json_get(&r, "active"), &active) && active);
	cr_assert_str_eq(json_str(json_get(&r, "path")), path);
	json_free(&r);
	vpmm_trace_event(VPMM_TRACE_ALLOCATE, 0x1000, 10, 0);
	cr_assert(exchange(fd, "vpmm 1 trace stop\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 config\n", &r));
	cr_assert(reply_ok(&r));
	cr_assert_str_eq(json_str(json_get(&r, "socket")), h.sock);
	json_free(&r);

	/* a version we do not speak: error, then the connection closes */
	cr_assert(exchange(fd, "vpmm 2 map\n", &r));
	cr_assert_not(reply_ok(&r));
	cr_assert_not_null(strstr(json_str(json_get(&r, "error")), "protocol version 2"));
	json_free(&r);
	cr_assert(at_eof(fd));
	close(fd);

	/* too long: error, then closed */
	fd = dial(h.sock);
	char big[VPMM_REQUEST_MAX + 100];
	memset(big, 'a', sizeof(big));
	cr_assert(send_all(fd, big, sizeof(big)));
	char *line = read_line(fd);
	cr_assert_not_null(line);
	cr_assert_not_null(strstr(line, "too long"), "%s", line);
	free(line);
	cr_assert(at_eof(fd));
	close(fd);

	/* silent: closed after the timeout, and others are served meanwhile */
	int quiet = dial(h.sock);
	fd = dial(h.sock);
	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	close(fd);
	cr_assert(at_eof(quiet), "a silent client was never dropped");
	close(quiet);
	host_close(&h);
}

/* `echo "vpmm 1 ping" | socat - UNIX-CONNECT:...`: the client shuts its
 * writing side down before it reads. Every complete line is answered, in
 * order, a last line without its newline is dropped, then the server
 * closes. */
Test(dump, a_client_that_stops_writing_is_still_answered)
{
	struct host h;
	host_open(&h, "half.sock", 0, 64);
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	const char *req = "vpmm 1 ping\nvpmm 1 version\nvpmm 1 pi";
	cr_assert(send_all(fd, req, strlen(req)));
	cr_assert_eq(shutdown(fd, SHUT_WR), 0);
	for (int i = 0; i < 2; i++) {
		char *line = read_line(fd);
		cr_assert_not_null(line, "reply %d of 2 missing", i + 1);
		cr_assert_not_null(strstr(line, "\"ok\":true"), "%s", line);
		cr_assert_not_null(strstr(line, i ? "\"version\"" : "\"pid\""), "%s", line);
		free(line);
	}
	cr_assert(at_eof(fd), "more than the two replies, or not closed");
	close(fd);
	host_close(&h);
}
Test(dump, gone_stale_and_old_protocol_are_clear_failures)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	struct run r;

	/* a process that is gone */
	pid_t dead = dead_pid();
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld", (long)dead);
	run((char *[]){ VPMM_DUMP, pid, NULL }, &r);
	cr_assert_eq(r.status, 3, "gone: status %d", r.status);
	cr_assert_not_null(strstr(r.err, "no process"), "%s", r.err);
	run_free(&r);

	/* a live process without a socket (ourselves, no server) */
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	run((char *[]){ VPMM_DUMP, pid, NULL }, &r);
	cr_assert_eq(r.status, 3);
	cr_assert_not_null(strstr(r.err, "no vpmm socket"), "%s", r.err);
	run_free(&r);

	/* a stale socket: bound, nobody listening any more */
	char stale[128];
	snprintf(stale, sizeof(stale), "%s/vpmm", dir);
	cr_assert_eq(mkdir(stale, 0700), 0);
	snprintf(stale, sizeof(stale), "%s/vpmm/%ld.sock", dir, (long)dead);
	close(listen_at(stale));
	run((char *[]){ VPMM_DUMP, "--socket", stale, NULL }, &r);
	cr_assert_eq(r.status, 3, "stale: status %d", r.status);
	cr_assert_not_null(strstr(r.err, "stale"), "%s", r.err);
	run_free(&r);
	setenv("XDG_RUNTIME_DIR", dir, 1);
	run((char *[]){ VPMM_DUMP, NULL }, &r);
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "stale (process gone)"), "%s", r.out);
	run_free(&r);
	cr_assert_eq(access(stale, F_OK), 0, "vpmm-dump removed a stale socket");

	/* another protocol version */
	char path[128];
	snprintf(path, sizeof(path), "%s/new.sock", dir);
	const char *const newer[] = {
		"{\"protocol\":2,\"ok\":false,\"error\":\"unsupported protocol version 1: "
		"this process speaks version 2\"}\n",
		NULL};
	struct fake_seq f;
	ask_fake(path, newer, (char *[]){ VPMM_DUMP, "--socket", path, NULL }, &r, &f);
	cr_assert_eq(r.status, 5, "old protocol: status %d (%s)", r.status, r.err);
	cr_assert_not_null(strstr(r.err, "protocol 2"), "%s", r.err);
	run_free(&r);

	/* garbage instead of a reply */
	const char *const garbage[] = {"this is not json\n", NULL};
	ask_fake(path, garbage, (char *[]){ VPMM_DUMP, "--socket", path, NULL }, &r, &f);
	cr_assert_eq(r.status, 1, "garbage reply: status %d", r.status);
	cr_assert_not_null(strstr(r.err, "malformed reply"), "%s", r.err);
	run_free(&r);

	remove_dir(dir);
}

/* What a server sends is data, not trusted (review): a page size that
 * wraps the map's cell arithmetic, control characters for the terminal, a
 * --trim value longer than a request; and options with bad values. */
Test(dump, hostile_replies_and_bad_values)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/f.sock", dir);
	struct fake_seq f;
	struct run r;
	const char *map =
		"{\"protocol\":1,\"ok\":true,\"pid\":1,\"pools\":[{\"device\":0,"
		"\"config\":{\"page_size\":18446744073709551615},\"stats\":{\"live\":1,"
		"\"evil\\u001b[2J\":3},\"chunks\":[{\"index\":0,\"va\":0,\"size\":1048576}],"
		"\"regions\":[{\"va\":0,\"size\":65536,\"kind\":\"live\\u001b]0;x\\u0007\","
		"\"chunk\":0}]}]}\n";
	const char *config = "{\"protocol\":1,\"ok\":true,\"socket\":\"s\"}\n";
	const char *const replies[] = {map, config, NULL};
	const char *modes[] = {"--map", NULL};
	for (int i = 0; i < 2; i++) {
		ask_fake(path, replies,
			 i ? (char *[]){VPMM_DUMP, "--socket", path, NULL}
			   : (char *[]){VPMM_DUMP, "--socket", path, (char *)modes[0], NULL},
			 &r, &f);
		cr_expect(r.status == 0 || r.status == 1, "%s: status %d (a signal?)",
			  i ? "text" : "--map", r.status);
		cr_expect_null(strchr(r.out, '\033'), "%s: an escape reached the terminal: %s",
			       i ? "text" : "--map", r.out);
		cr_expect_null(strchr(r.out, '\007'), "%s: a bell: %s", i ? "text" : "--map", r.out);
		run_free(&r);
	}

	/* --trim sends the bytes it parsed, whatever their spelling */
	char keep[80];
	memset(keep, '0', 70);
	snprintf(keep + 70, sizeof(keep) - 70, "1G");
	const char *const trimmed[] = {"{\"protocol\":1,\"ok\":true,\"released\":0}\n", NULL};
	ask_fake(path, trimmed, (char *[]){VPMM_DUMP, "--trim", "--socket", path, keep, NULL}, &r,
		 &f);
	cr_expect_eq(r.status, 0, "%s", r.err);
	cr_expect_str_eq(f.got[0], "vpmm 1 trim 1073741824");
	run_free(&r);
	/* a trim reply without its count is malformed: it printed "released
	 * 0 bytes" and succeeded */
	static const char *const bad_trims[] = {"{\"protocol\":1,\"ok\":true}\n",
						"{\"protocol\":1,\"ok\":true,\"released\":-5}\n",
						"{\"protocol\":1,\"ok\":true,\"released\":\"9\"}\n"};
	for (size_t i = 0; i < 3; i++) {
		const char *const one[] = {bad_trims[i], NULL};
		ask_fake(path, one, (char *[]){VPMM_DUMP, "--trim", "--socket", path, NULL}, &r, &f);
		cr_expect_eq(r.status, 1, "reply %zu: status %d: %s", i, r.status, r.err);
		cr_expect(strstr(r.err, "malformed reply to trim"), "reply %zu: %s", i, r.err);
		cr_expect_null(strstr(r.out, "released"), "reply %zu: %s", i, r.out);
		run_free(&r);
	}

	/* a reply with no protocol at all is malformed, not another version,
	 * and so is one whose protocol is no version (0, a string): only a
	 * real version asks for another vpmm-dump; a path that is not a
	 * socket is not a stale one */
	static const char *const no_version[] = {"{}\n", "{\"protocol\":0,\"ok\":true}\n",
						 "{\"protocol\":\"1\",\"ok\":true}\n"};
	for (size_t i = 0; i < sizeof(no_version) / sizeof(no_version[0]); i++) {
		const char *const reply[] = {no_version[i], NULL};
		ask_fake(path, reply, (char *[]){VPMM_DUMP, "--socket", path, NULL}, &r, &f);
		cr_expect_eq(r.status, 1, "%s: status %d: %s", no_version[i], r.status, r.err);
		cr_expect(strstr(r.err, "malformed reply (no protocol version)"), "%s: %s",
			  no_version[i], r.err);
		run_free(&r);
	}
	run((char *[]){VPMM_DUMP, "--socket", "/etc/passwd", NULL}, &r);
	cr_expect_eq(r.status, 1, "a regular file: status %d", r.status);
	cr_expect(strstr(r.err, "not a socket"), "%s", r.err);
	run_free(&r);

	/* bad option values: a clear message, no stray bytes */
	run((char *[]){VPMM_DUMP, "--count", " -1", "--watch", "1", "1", NULL}, &r);
	cr_expect_eq(r.status, 2, "--count \" -1\": status %d", r.status);
	run_free(&r);
	/* an empty socket path is a usage error, not "nobody serves" */
	run((char *[]){VPMM_DUMP, "--socket", "", NULL}, &r);
	cr_expect_eq(r.status, 2, "--socket \"\": status %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "--socket takes a path"), "%s", r.err);
	run_free(&r);
	run((char *[]){VPMM_DUMP, "--watch", NULL}, &r);
	cr_expect_eq(r.status, 2);
	cr_expect(strstr(r.err, "--watch: unknown option, or a value missing"), "%s", r.err);
	for (const char *c = r.err; *c; c++)
		cr_expect((unsigned char)*c >= 0x20 || *c == '\n', "a control byte in: %s", r.err);
	run_free(&r);

	remove_dir(dir);
}

/* ---- hooks ------------------------------------------------------------------- */

static int trim_hook(uint64_t keep, uint64_t *released, void *arg)
{
	struct host *h = arg;
	long long n = vpmm_pool_trim(h->pool, keep);
	if (n < 0)
		return (int)n;
	*released = (uint64_t)n;
	return 0;
}

Test(dump, trim_request_goes_to_its_hook)
{
	struct host h;
	memset(&h, 0, sizeof(h));
	snprintf(h.dir, sizeof(h.dir), "/tmp/vpmm-dump-test-XXXXXX");
	cr_assert_not_null(mkdtemp(h.dir));
	host_pool(&h, 64);
	char path[128];
	snprintf(path, sizeof(path), "%s/trim.sock", h.dir);
	struct vpmm_server_config sc = { .socket = path, .pools = one_pool, .arg = &h,
					 .trim = trim_hook };
	cr_assert_eq(vpmm_server_start(&sc), 0);
	snprintf(h.sock, sizeof(h.sock), "%s", path);
	CUdeviceptr a = alloc(&h, 4, VPMM_NO_STREAM);
	cr_assert_eq(vpmm_pool_free(h.pool, a, VPMM_NO_STREAM), 0);
	struct vpmm_stats before, after;
	vpmm_pool_stats(h.pool, &before);
	cr_assert_gt(before.reusable, 0);

	int fd = dial(h.sock);
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 trim 64x\n", &r));
	cr_assert_not(reply_ok(&r), "a bad size was taken");
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 trim\n", &r));
	cr_assert(reply_ok(&r), "trim refused");
	uint64_t released = 0;
	cr_assert(json_u64(json_get(&r, "released"), &released));
	json_free(&r);
	vpmm_pool_stats(h.pool, &after);
	cr_assert_eq(released, before.reusable, "released %" PRIu64 " of %" PRIu64, released,
		     before.reusable);
	cr_assert_eq(after.reusable, 0);
	cr_assert_eq(after.mapped, before.mapped - released);

	/* The same through the CLI: vpmm-dump --trim --socket PATH [KEEP]. */
	CUdeviceptr b = alloc(&h, 4, VPMM_NO_STREAM);
	cr_assert_eq(vpmm_pool_free(h.pool, b, VPMM_NO_STREAM), 0);
	vpmm_pool_stats(h.pool, &before);
	struct run cli;
	run((char *[]){ VPMM_DUMP, "--trim", "--socket", h.sock, NULL }, &cli);
	cr_assert_eq(cli.status, 0, "vpmm-dump --trim: %s", cli.err);
	char want[64];
	snprintf(want, sizeof(want), "released %" PRIu64 " bytes", before.reusable);
	cr_assert_not_null(strstr(cli.out, want), "%s", cli.out);
	run_free(&cli);
	run((char *[]){ VPMM_DUMP, "--trim", "--socket", h.sock, "lots", NULL }, &cli);
	cr_assert_eq(cli.status, 2, "a bad size was taken: %s", cli.out);
	cr_assert_not_null(strstr(cli.err, "lots"), "%s", cli.err);
	run_free(&cli);
	run((char *[]){ VPMM_DUMP, "--trim", "--socket", h.sock, "1G", NULL }, &cli);
	cr_assert_eq(cli.status, 0, "vpmm-dump --trim 1G: %s", cli.err);
	cr_assert_not_null(strstr(cli.out, "released 0 bytes"), "%s", cli.out);
	run_free(&cli);
	/* trace has no hooks here */
	cr_assert(exchange(fd, "vpmm 1 trace status\n", &r));
	cr_assert_not(reply_ok(&r));
	cr_assert_not_null(strstr(json_str(json_get(&r, "error")), "unsupported"));
	json_free(&r);
	close(fd);
	host_close(&h);
}

/* Whether the server closes the connection after answering `line`
 * (without its newline): a line of printable ASCII that names another
 * protocol version, as the protocol says ("vpmm N ..." with N a number
 * strtol reads whole, not negative, not VPMM_PROTOCOL). */
static bool closes_after(const char *line)
{
	for (const char *q = line; *q; q++)
		if ((unsigned char)*q < 0x20 || (unsigned char)*q > 0x7e)
			return false; /* refused before the version is read */
	if (strncmp(line, "vpmm ", 5) != 0)
		return false;
	char *end;
	errno = 0;
	long v = strtol(line + 5, &end, 10);
	return end != line + 5 && (*end == ' ' || *end == '\0') && !errno && v >= 0 &&
	       v != VPMM_PROTOCOL;
}

/* Requests made at random from the protocol's words, numbers out of range,
 * sizes, printf conversions, control and non-ASCII bytes and long words:
 * each is answered with a reply that parses, an error saying why where it
 * is refused, and the connection closes after exactly the requests that
 * name another protocol version (closes_after). The generator is seeded:
 * a failure repeats. */
Test(dump, random_requests_are_answered)
{
	TEST_DEADLINE(120);
	struct host h;
	host_open(&h, "r.sock", 30000, 64);
	static const char *const heads[] = { "vpmm 1 ", "vpmm 2 ", "vpmm ", "", "vpmm 1  ",
					     "VPMM 1 ", "vpmm 01 ", "vpmm 1\t", "vpmm +1 ",
					     "vpmm  3 " };
	static const char *const words[] = { "ping", "version", "help", "stats", "map",
					     "config", "trim", "trace", "ipc-open", "ipc-pieces",
					     "ipc-close", "start", "stop", "status", "flush",
					     "0", "-1", "1M", "1Q", "18446744073709551615",
					     "18446744073709551616", "0x10", "1e9", "nan", "/",
					     "", " ", "\t", "\x01", "\xff", "\"", "\\", "{}",
					     "%s%n", "../..", "99999999999999999999999" };
	const size_t nheads = sizeof(heads) / sizeof(heads[0]);
	const size_t nwords = sizeof(words) / sizeof(words[0]);
	char req[1200];
	int fd = dial(h.sock);
	cr_assert_geq(fd, 0);
	unsigned closed = 0;
	for (int i = 0; i < 4000; i++) {
		size_t n = (size_t)snprintf(req, sizeof(req), "%s", heads[rnd() % nheads]);
		for (unsigned k = rnd() % 5; k > 0; k--)
			n += (size_t)snprintf(req + n, sizeof(req) - n, "%s%s", words[rnd() % nwords],
					      rnd() % 4 ? " " : "");
		if (rnd() % 16 == 0) { /* a long word */
			unsigned len = 1 + rnd() % 800;
			for (unsigned k = 0; k < len && n < sizeof(req) - 2; k++)
				req[n++] = (char)('a' + rnd() % 26);
		}
		req[n] = '\0';
		/* "trace start" with a word after it writes a file: only
		 * into this test's directory, never a path the words make */
		const char *t = strstr(req, "trace");
		if (t && strstr(t, "start"))
			n = (size_t)snprintf(req, sizeof(req), "vpmm 1 trace start %s/r%d.csv",
					     h.dir, i % 4);
		bool closes = closes_after(req);
		req[n++] = '\n';
		req[n] = '\0';
		struct json r;
		cr_assert(exchange(fd, req, &r), "no reply to request %d: %s", i, req);
		cr_assert(json_get(&r, "ok") != NULL, "reply to request %d without ok", i);
		if (!reply_ok(&r))
			cr_assert_not_null(json_str(json_get(&r, "error")), "request %d", i);
		else
			cr_assert_not(closes, "request %d accepted: %s", i, req);
		json_free(&r);
		if (closes) {
			struct pollfd pf = { .fd = fd, .events = POLLIN };
			cr_assert(poll(&pf, 1, 10000) == 1 && at_eof(fd),
				  "request %d left the connection open: %s", i, req);
			close(fd);
			closed++;
			fd = dial(h.sock);
			cr_assert_geq(fd, 0, "the server stopped accepting after request %d", i);
		}
	}
	struct json r;
	cr_assert(exchange(fd, "vpmm 1 trace stop\n", &r));
	json_free(&r);
	cr_assert(exchange(fd, "vpmm 1 ping\n", &r));
	cr_assert(reply_ok(&r));
	json_free(&r);
	cr_assert_gt(closed, 100, "only %u requests of another version", closed);
	close(fd);
	host_close(&h);
}
