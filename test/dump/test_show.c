/* test_show.c — what vpmm-dump shows of a pool: the JSON document against
 * the pool's own view (checked by check_dump.py too), the text and --map
 * output in the region map's notation, names kept exact in JSON and made printable
 * in text. Helpers: dump_test.h.
 */
#include <criterion/criterion.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <unistd.h>

#include "driver_host.h"
#include "dump_test.h"
#include "json.h"
#include "snapshot.h"
#include "vpmm.h"

/* ---- what vpmm-dump shows ------------------------------------------------------ */

struct expected {
	size_t nregions;
	uint64_t by_kind[4];
};

/* What the dump must show: the pool's own region map, where an allocation
 * the program freed may still be live (parked in the stream's cache for a
 * quick reuse): to the program, and so in the dump, it is free memory of the
 * stream that freed it. */
static void pool_truth(struct host *h, CUdeviceptr freed, CUstream s,
		       struct vpmm_region_info **regions, size_t *n, struct expected *e)
{
	*n = vpmm_pool_regions(h->pool, NULL, 0);
	*regions = calloc(*n + 1, sizeof(**regions));
	cr_assert_eq(vpmm_pool_regions(h->pool, *regions, *n), *n);
	memset(e, 0, sizeof(*e));
	e->nregions = *n;
	for (size_t i = 0; i < *n; i++) {
		struct vpmm_region_info *r = &(*regions)[i];
		if (r->va == freed && r->kind == VPMM_REGION_LIVE) {
			r->kind = VPMM_REGION_FREE;
			r->stream = s;
			r->settled = false;
		}
		e->by_kind[r->kind] += r->size;
	}
}

Test(dump, json_matches_the_pool)
{
	struct host h;
	host_open(&h, "explicit.sock", 0, 64);
	CUstream s = vpmm_host_stream_create(h.drv);
	CUdeviceptr live[2];
	CUdeviceptr freed = make_all_kinds(&h, s, live);

	struct vpmm_region_info *truth;
	size_t n;
	struct expected e;
	pool_truth(&h, freed, s, &truth, &n, &e);
	for (int k = 0; k < 4; k++)
		cr_assert_gt(e.by_kind[k], 0, "the scenario lacks kind %d", k);

	char pid[32], out[128];
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());
	struct run r;
	run((char *[]){ VPMM_DUMP, "--json", "--socket", h.sock, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	struct json doc;
	char err[128];
	cr_assert_eq(json_parse(r.out, strlen(r.out), &doc, err, sizeof(err)), 0, "%s", err);
	const struct json *pools = json_get(&doc, "pools");
	cr_assert(pools && pools->n == 1);
	const struct json *regions = json_get(&pools->items[0], "regions");
	cr_assert_eq(regions->n, n, "%zu regions in the dump, %zu in the pool", regions->n, n);
	for (size_t i = 0; i < n; i++) {
		const struct json *jr = &regions->items[i];
		uint64_t va = 0, size = 0;
		json_u64(json_get(jr, "va"), &va);
		json_u64(json_get(jr, "size"), &size);
		cr_assert_eq(va, truth[i].va, "region %zu va", i);
		cr_assert_eq(size, truth[i].size, "region %zu size", i);
		cr_assert_str_eq(json_str(json_get(jr, "kind")), vpmm_region_kind_name(truth[i].kind));
		if (truth[i].kind == VPMM_REGION_FREE) {
			uint64_t stream = 0;
			bool settled = true;
			cr_assert(json_u64(json_get(jr, "stream"), &stream));
			cr_assert(json_bool(json_get(jr, "settled"), &settled));
			cr_assert_eq(stream, (uint64_t)(uintptr_t)truth[i].stream);
			cr_assert_eq(settled, truth[i].settled);
		}
	}
	/* Every allocation we hold is a live region of its size, and nothing
	 * else is live. */
	size_t nlive = 0;
	for (size_t i = 0; i < n; i++) {
		if (truth[i].kind != VPMM_REGION_LIVE)
			continue;
		nlive++;
		cr_assert(truth[i].va == live[0] || truth[i].va == live[1]);
		cr_assert_eq(truth[i].size, (truth[i].va == live[0] ? 1 : 3) * PAGE);
	}
	cr_assert_eq(nlive, 2);
	json_free(&doc);

	/* The same document read by Python's json module. */
	if (!have_file(PYTHON3)) {
		run_free(&r);
		free(truth);
		host_close(&h);
		cr_skip("python3 not found at " PYTHON3 ": the independent JSON check did not run");
	}
	snprintf(out, sizeof(out), "%s/dump.json", h.dir);
	FILE *f = fopen(out, "w");
	cr_assert_not_null(f);
	fputs(r.out, f);
	fclose(f);
	run_free(&r);
	char live_s[32], nreg[32], kinds[256];
	snprintf(live_s, sizeof(live_s), "%zu", 4 * PAGE);
	snprintf(nreg, sizeof(nreg), "%zu", n);
	snprintf(kinds, sizeof(kinds), "live=%" PRIu64 ",free=%" PRIu64 ",hole=%" PRIu64
		 ",zombie=%" PRIu64, e.by_kind[0], e.by_kind[1], e.by_kind[2], e.by_kind[3]);
	run((char *[]){ PYTHON3, TEST_DIR "/check_dump.py", out, pid, live_s, nreg, kinds, NULL },
	    &r);
	cr_assert_eq(r.status, 0, "check_dump.py: %s%s", r.out, r.err);
	run_free(&r);
	free(truth);
	host_close(&h);
}

Test(dump, text_and_map_use_the_map_symbols)
{
	struct host h;
	host_open(&h, "", 0, 64);
	CUstream s = vpmm_host_stream_create(h.drv);
	CUdeviceptr live[2];
	make_all_kinds(&h, s, live);
	char pid[32];
	snprintf(pid, sizeof(pid), "%ld", (long)getpid());

	struct run r;
	run((char *[]){ VPMM_DUMP, pid, NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	/* [~2][1][3][-2][*56] in 64K pages: sizes are written in K/M/G */
	const char *want[] = { "[~128K]", "[64K]", "[192K]", "[-128K]", "[*3584K]", "reserved",
			       "mapped", "live", "reusable", "holes", "zombies", "peak", "defrags",
			       "pages_remapped", "layout: [~128K][64K][192K][-128K][*3584K]",
			       /* the free pages are two handles of their own */
			       "free: 128.00 KiB in 2 wholly free handles, 0 B stranded in 0 partly "
			       "live ones;\n        the largest free region 128.00 KiB\n" };
	for (size_t i = 0; i < sizeof(want) / sizeof(want[0]); i++)
		cr_assert_not_null(strstr(r.out, want[i]), "\"%s\" missing from:\n%s", want[i], r.out);
	char stream[64];
	snprintf(stream, sizeof(stream), "stream 0x%" PRIxPTR, (uintptr_t)s);
	cr_assert_not_null(strstr(r.out, stream), "the free region's %s missing:\n%s", stream,
			   r.out);
	/* ascending VA */
	const char *p1 = strstr(r.out, "[~128K] "), *p2 = strstr(r.out, "[*3584K] ");
	cr_assert(p1 && p2 && p1 < p2);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, pid, "--map", "--color", "never", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	/* 8 used pages, one cell each: ~~#+###--  */
	cr_assert_not_null(strstr(r.out, "|~~####--|"), "map:\n%s", r.out);
	cr_assert_null(strstr(r.out, "\033["), "colors without a terminal");
	run_free(&r);
	run((char *[]){ VPMM_DUMP, pid, "--map", "--color", "always", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	cr_assert_not_null(strstr(r.out, "\033[42;30m#"), "no colored live cell:\n%s", r.out);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, pid, "--watch", "0.1", "--count", "3", NULL }, &r);
	cr_assert_eq(r.status, 0, "%s", r.err);
	int shown = 0;
	for (const char *p = r.out; (p = strstr(p, "layout:")); p++)
		shown++;
	cr_assert_eq(shown, 3, "--watch --count 3 drew %d times", shown);
	run_free(&r);

	run((char *[]){ VPMM_DUMP, "--help", NULL }, &r);
	cr_assert_eq(r.status, 0);
	cr_assert_not_null(strstr(r.out, "--torch-snapshot"));
	run_free(&r);
	host_close(&h);
}
/* --json is for programs: names come out exactly as the process gave them
 * (escaped, not altered); text is for a terminal: no control byte of a
 * name reaches it, while UTF-8 (a user's file names) is still shown. The
 * names: the command (/proc/PID/comm), the socket path, the reply's strings
 * and keys. */
Test(dump, json_keeps_names_exact_and_text_makes_them_printable)
{
	char dir[64] = "/tmp/vpmm-dump-test-XXXXXX";
	cr_assert_not_null(mkdtemp(dir));
	char path[128];
	snprintf(path, sizeof(path), "%s/s\001\xc3\xa9.sock", dir);
	/* The reply's pid is ours: its comm is what vpmm-dump reads. */
	static const char comm[] = "vd\001\033\xc3\xa9x";
	char old_comm[16] = "";
	cr_assert_eq(prctl(PR_GET_NAME, old_comm), 0);
	cr_assert_eq(prctl(PR_SET_NAME, comm), 0);
	char map[1024];
	snprintf(map, sizeof(map),
		 "{\"protocol\":1,\"ok\":true,\"pid\":%ld,\"pools\":[{\"device\":0,"
		 "\"config\":{\"page_size\":65536},\"stats\":{\"live\":0,"
		 "\"evil\\u0001\xc3\xa9\":3},\"chunks\":[],\"regions\":[]}]}\n",
		 (long)getpid());
	const char *config = "{\"protocol\":1,\"ok\":true,\"trace\":\"/t/\\u001b]0;x\\u0007"
			     "\xc3\xa9.csv\"}\n";
	const char *const replies[] = {map, config, NULL};
	struct fake_seq fs;
	struct run r;

	ask_fake(path, replies, (char *[]){VPMM_DUMP, "--socket", path, "--json", NULL}, &r, &fs);
	cr_expect_eq(r.status, 0, "--json: status %d: %s", r.status, r.err);
	size_t len = strlen(r.out);
	cr_expect(len && r.out[len - 1] == '\n', "--json: not one line: %s", r.out);
	for (size_t i = 0; i + 1 < len; i++)
		cr_expect((unsigned char)r.out[i] >= 0x20 && r.out[i] != 0x7f,
			  "--json: a raw control byte 0x%02x at %zu (not escaped)",
			  (unsigned char)r.out[i], i);
	struct json doc;
	char perr[128];
	cr_assert_eq(json_parse(r.out, len ? len - 1 : 0, &doc, perr, sizeof(perr)), 0,
		     "--json: not JSON (%s): %s", perr, r.out);
	const char *got = json_str(json_get(&doc, "command"));
	cr_expect(got && !strcmp(got, comm), "--json: command altered: %s", r.out);
	got = json_str(json_get(&doc, "socket"));
	cr_expect(got && !strcmp(got, path), "--json: socket altered: %s", r.out);
	got = json_str(json_get(json_get(&doc, "process"), "trace"));
	cr_expect(got && !strcmp(got, "/t/\033]0;x\007\xc3\xa9.csv"), "--json: trace altered: %s",
		  r.out);
	const struct json *pools = json_get(&doc, "pools");
	cr_assert(pools && pools->type == JSON_ARRAY && pools->n == 1, "%s", r.out);
	const struct json *stats = json_get(&pools->items[0], "stats");
	cr_expect(json_get(stats, "evil\001\xc3\xa9") != NULL, "--json: stats key altered: %s",
		  r.out);
	json_free(&doc);
	run_free(&r);

	ask_fake(path, replies, (char *[]){VPMM_DUMP, "--socket", path, NULL}, &r, &fs);
	cr_expect_eq(r.status, 0, "text: status %d: %s", r.status, r.err);
	for (const char *c = r.out; *c; c++)
		cr_expect(((unsigned char)*c >= 0x20 && *c != 0x7f) || *c == '\n',
			  "text: a control byte 0x%02x at %td: %s", (unsigned char)*c, c - r.out,
			  r.out);
	cr_expect(strstr(r.out, "\xc3\xa9.sock"), "text: the socket's UTF-8 name is lost: %s",
		  r.out);
	cr_expect(strstr(r.out, "\xc3\xa9x"), "text: the command's UTF-8 is lost: %s", r.out);
	run_free(&r);

	cr_assert_eq(prctl(PR_SET_NAME, old_comm), 0);
	remove_dir(dir);
}
