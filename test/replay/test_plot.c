/* test_plot.c — vpmm-replay's --plot (an SVG read back with python3's
 * xml.etree: its lines, markers, legend and sampling), the --plot file's
 * errors, and the progress line (only on a terminal: a pty made by python3's
 * pty module). Uses the suite's shared parts (replay_test.h).
 */
#include <criterion/criterion.h>
#include <inttypes.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "replay_test.h"

/* Checks an SVG with python3: the script gets the SVG's root as `svg`, the
 * namespace prefix as `ns`, and its arguments after the file as `args`; it
 * prints "ok" when all its asserts hold. */
static void check_svg(const char *svg_path, const char *checks, const char *arg)
{
	char script[4096];
	snprintf(script, sizeof(script),
		 "import sys, xml.etree.ElementTree as ET\n"
		 "svg = ET.parse(sys.argv[1]).getroot()\n"
		 "ns = '{http://www.w3.org/2000/svg}'\n"
		 "args = sys.argv[2:]\n"
		 "assert svg.tag == ns + 'svg', svg.tag\n"
		 "lines = {p.get('id'): p for p in svg.iter(ns + 'polyline')}\n"
		 "assert set(lines) == {'live', 'mapped'}, lines\n"
		 "def points(i):\n"
		 "    return [tuple(map(float, xy.split(','))) for xy in lines[i].get('points').split()]\n"
		 "marks = [m for g in svg.iter(ns + 'g') if g.get('id') == 'marks' for m in g]\n"
		 "texts = [''.join(t.itertext()) for t in svg.iter(ns + 'text')]\n"
		 "%s\n"
		 "print('ok')\n",
		 checks);
	struct run r = run_prog(getenv("PYTHON3"),
				(const char *[]){ "-c", script, svg_path, arg, NULL }, NULL);
	cr_expect_eq(r.status, 0, "%s: %s", svg_path, r.err);
	cr_expect_str_eq(r.out, "ok\n");
	run_free(&r);
}

Test(replay, plot_draws_the_scenario)
{
	const char *log = spec_log();
	char svg[300];
	snprintf(svg, sizeof(svg), "%s/spec.svg", dir);
	struct run r = replay((const char *[]){ "--page-size", "1G", "--json", "--plot", svg,
						log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_str_empty(r.err);
	/* the report is as without --plot */
	cr_expect_eq(json_u64(r.out, "peak_mapped_bytes"), 16 * GiB, "%s", r.out);
	run_free(&r);
	/* +10 and +1 grow (10 handles of 1 GiB, then 1), +11 remaps the 6 free
	 * and creates 5: three markers, the last the defragmentation at the
	 * top of the mapped line, which the live line reaches there too. */
	check_svg(svg,
		  "kinds = [m.get('class') for m in marks]\n"
		  "assert kinds == ['room-growth', 'room-growth', 'remap'], kinds\n"
		  "tips = [''.join(m.itertext()) for m in marks]\n"
		  "assert tips[0].startswith('operation 1: '), tips\n"
		  "assert 'created 10' in tips[0], tips\n"
		  "assert tips[2].startswith('operation 5: defragmentation'), tips\n"
		  "assert 'remapped 6, created 5' in tips[2], tips\n"
		  "assert 'mapped 16.00 GiB' in tips[2], tips\n"
		  "m, l = points('mapped'), points('live')\n"
		  "top = min(y for x, y in m)\n"
		  "assert float(marks[2].get('cy')) == top, (marks[2].attrib, top)\n"
		  "assert min(y for x, y in l) == top, l\n"
		  "assert max(x for x, y in m) == float(marks[2].get('cx')), m\n"
		  "assert any(t.endswith('spec.csv') for t in texts), texts\n"
		  "assert 'defragmentation (remap): 1' in texts, texts\n"
		  "assert 'growth (device had room): 2' in texts, texts\n"
		  "assert any(t.endswith(' GiB') for t in texts), texts\n",
		  NULL);
}

/* A long log is drawn from a few thousand points, not one per operation,
 * and a log named with markup and bytes that are not UTF-8 still makes
 * XML. */
Test(replay, plot_samples_a_long_log)
{
	struct logbuf l;
	log_open(&l);
	unsigned pairs = 15000;
	for (unsigned i = 0; i < pairs; i++) {
		/* one block kept every 100, the rest freed at once: sizes vary */
		uint64_t size = (uint64_t)(1 + i % 7) * MiB;
		log_add(&l, "1,t,allocate,0x%x,%" PRIu64 ",0x0", 0x10000 + i, size);
		if (i % 100)
			log_add(&l, "1,t,free,0x%x,%" PRIu64 ",0x0", 0x10000 + i, size);
	}
	const char *log = log_write(&l, "a&b<c>-\xff.csv");
	char svg[300];
	snprintf(svg, sizeof(svg), "%s/long.svg", dir);
	struct run r = replay((const char *[]){ "--json", "--plot", svg, log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	uint64_t ops = json_u64(r.out, "ops");
	cr_expect_eq(ops, 2 * pairs - pairs / 100, "%s", r.out);
	run_free(&r);
	char n[32];
	snprintf(n, sizeof(n), "%" PRIu64, ops);
	/* A step line has two points per sample; samples: about 2000 evenly
	 * spaced, plus one per marker. */
	check_svg(svg,
		  "ops = int(args[0])\n"
		  "m = points('mapped')\n"
		  "assert len(points('live')) == len(m)\n"
		  "assert 2 * 2000 <= len(m) <= 2 * (2000 + len(marks)) + 4, (len(m), len(marks))\n"
		  "assert len(m) < ops, (len(m), ops)\n"
		  "xs = [x for x, y in m]\n"
		  "assert xs == sorted(xs), 'not in order'\n"
		  "assert any('a&b<c>-\\ufffd.csv' in t for t in texts), texts\n",
		  n);
}

Test(replay, plot_file_errors)
{
	const char *log = spec_log();
	char *before = slurp(log);
	char bad[300];
	snprintf(bad, sizeof(bad), "%s/no-such-dir/x.svg", dir);
	struct run r = replay((const char *[]){ "--plot", bad, log, NULL }, NULL);
	cr_expect_eq(r.status, 2, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "cannot write the plot") && strstr(r.err, bad) &&
		  strstr(r.err, "No such file"), "%s", r.err);
	cr_expect_str_empty(r.out, "a report after a refused --plot");
	run_free(&r);

	/* the log itself: refused, and the log is left whole */
	r = replay((const char *[]){ "--plot", log, log, NULL }, NULL);
	cr_expect_eq(r.status, 2, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "that is the log"), "%s", r.err);
	char *after = slurp(log);
	cr_expect_str_eq(after, before);
	free(after);
	free(before);
	run_free(&r);

	static const char *const names[] = { "", "-" };
	for (size_t i = 0; i < 2; i++) {
		r = replay((const char *[]){ "--plot", names[i], log, NULL }, NULL);
		cr_expect_eq(r.status, 2, "--plot \"%s\": exit %d", names[i], r.status);
		cr_expect(strstr(r.err, "--plot") && strstr(r.err, "expected a file name"), "%s",
			  r.err);
		run_free(&r);
	}

	/* a malformed log leaves an image already there as it was, and
	 * leaves no new one behind (it emptied the old one) */
	char badlog[300], kept[300], fresh[300];
	snprintf(badlog, sizeof(badlog), "%s/malformed.csv", dir);
	snprintf(kept, sizeof(kept), "%s/kept.svg", dir);
	snprintf(fresh, sizeof(fresh), "%s/fresh.svg", dir);
	FILE *f = fopen(badlog, "w");
	cr_assert_not_null(f);
	fputs("Thread,Time,Action,Pointer,Size\n", f);
	fclose(f);
	f = fopen(kept, "w");
	cr_assert_not_null(f);
	fputs("<svg>an earlier image</svg>\n", f);
	fclose(f);
	for (int i = 0; i < 4; i++) {
		/* and settings that make no pool, found once the log is read */
		const char *path = i & 1 ? fresh : kept;
		r = replay(i < 2 ? (const char *[]){ "--plot", path, badlog, NULL }
				 : (const char *[]){ "--plot", path, "--page-size", "1M", log, NULL },
			   NULL);
		cr_expect_eq(r.status, i < 2 ? 2 : 1, "case %d: exit %d: %s", i, r.status, r.err);
		run_free(&r);
	}
	char *img = slurp(kept);
	cr_expect_str_eq(img, "<svg>an earlier image</svg>\n");
	free(img);
	cr_expect(access(fresh, F_OK) != 0, "%s left behind by a malformed log", fresh);
	/* and a good log replaces it whole */
	r = replay((const char *[]){ "--plot", kept, log, NULL }, NULL);
	cr_expect_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	run_free(&r);
	img = slurp(kept);
	cr_expect(strncmp(img, "<?xml", 5) == 0 || strncmp(img, "<svg", 4) == 0, "%.60s", img);
	cr_expect_null(strstr(img, "an earlier image"));
	free(img);
	unlink(badlog);
	unlink(kept);

	/* opened, but the image cannot be written whole */
	r = replay((const char *[]){ "--plot", "/dev/full", log, NULL }, NULL);
	cr_expect_eq(r.status, 1, "exit %d: %s", r.status, r.err);
	cr_expect(strstr(r.err, "writing the plot /dev/full: No space left"), "%s", r.err);
	run_free(&r);
}

/* A log of 100 000 operations shows its progress on a terminal (a pty),
 * and nothing when stderr is a file. */
Test(replay, progress_only_on_a_terminal)
{
	struct logbuf l;
	log_open(&l);
	for (unsigned i = 0; i < 50000; i++) {
		log_add(&l, "1,t,allocate,0x%x,4096,0x0", 0x10000 + i);
		log_add(&l, "1,t,free,0x%x,4096,0x0", 0x10000 + i);
	}
	const char *log = log_write(&l, "progress.csv");

	struct run r = replay((const char *[]){ "--json", log, NULL }, NULL);
	cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
	cr_expect_eq(json_u64(r.out, "ops"), 100000, "%s", r.out);
	cr_expect_str_empty(r.err, "progress on a file: %s", r.err);
	run_free(&r);

	/* stderr a pty, stdout /dev/null: what the terminal saw */
	const char *script =
		"import os, pty, sys\n"
		"pid, fd = pty.fork()\n"
		"if pid == 0:\n"
		"    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)\n"
		"    os.execv(sys.argv[1], sys.argv[1:])\n"
		"seen = b''\n"
		"while True:\n"
		"    try:\n"
		"        d = os.read(fd, 4096)\n"
		"    except OSError:\n"
		"        break\n"
		"    if not d:\n"
		"        break\n"
		"    seen += d\n"
		"_, st = os.waitpid(pid, 0)\n"
		"assert os.WIFEXITED(st) and os.WEXITSTATUS(st) == 0, st\n"
		"assert b'replaying ' in seen and b'progress.csv: 0%' in seen, seen\n"
		"assert seen.endswith(b'\\r\\x1b[K'), seen[-40:]\n"
		"print('ok')\n";
	r = run_prog(getenv("PYTHON3"),
		     (const char *[]){ "-c", script, getenv("VPMM_REPLAY"), log, NULL }, NULL);
	cr_expect_eq(r.status, 0, "python: %s", r.err);
	cr_expect_str_eq(r.out, "ok\n");
	run_free(&r);
}
