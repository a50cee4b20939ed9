// oom.cu — out of memory for real: allocate until the
// GPU is full, free, allocate again; the program recovers, and vpmm-dump and
// nvidia-smi agree on what the process holds. Then the memory is given back:
// `vpmm-dump --trim PID` releases the free pages and nvidia-smi shows the
// drop. An unmodified CUDA program: it runs with and without libvpmm.so
// (scripts/gpu-reliability.sh runs both; the plain run shows that the
// program's own method and tolerances hold for cudaMalloc itself).
//
// The checks (one "check NAME:" line each, reliability.h):
//   oom.fill     cudaMalloc of 1 GiB, then 512 MiB, ... down to 2 MiB, each
//                until it fails, gets at least (1 - OOM_FILL_TOL) of what
//                cudaMemGetInfo called free before (default 3 %: the driver's
//                own page tables and whatever the last 2 MiB cannot cover);
//                a pool that gave up early would fail here;
//   oom.error    every failure is cudaErrorMemoryAllocation, and no error is
//                sticky: after cudaGetLastError, cudaPeekAtLastError is clean;
//   oom.log      (pool) each of the first OOM_LOG_BURST failed calls wrote
//                the shim's one "out of memory: requested N bytes" line
//                (shim/alloc.c) naming its size, later ones at most one
//                (the shim shows one a second after that, with a count);
//                no such line during a successful call; none elsewhere;
//   oom.recover  on the full GPU, after freeing the last chunks (>= 64 MiB:
//                the CUDA pool behind a plain cudaMallocAsync grows by more
//                than one page): cudaMalloc and cudaMallocAsync of 1 MiB and
//                kernels on them work, cudaGetLastError is clean (the stream
//                is made before the GPU fills: under the pool, freed memory
//                stays mapped, and creating a stream on a full device is not
//                what this checks);
//   oom.data     every chunk still holds its pattern after all the failures
//                (a failed growth must not disturb mapped memory);
//   oom.refill   everything freed, the same sizes allocated again: all
//                succeed; with the pool, no page is created and no failure
//                counted (the pool reuses what it mapped);
//   oom.dump     (pool, VPMM_DUMP) vpmm-dump --json of this process gives the
//                stats the process itself reads: mapped and live equal;
//   oom.smi      the growth of nvidia-smi's figure since the start equals the
//                growth of the pool's mapped bytes (plain: the bytes
//                cudaMalloc handed out) within OOM_TOL_MIB + OOM_TOL_FRAC of
//                it (default 64 MiB + 0.25 %); the CUDA context (~500 MiB)
//                and the kernels' modules are in the baseline, taken after
//                the first allocation and kernel launches, not assumed;
//   oom.keep     (pool, no VPMM_RELEASE_THRESHOLD) freeing everything keeps
//                it mapped (mapped unchanged) and nvidia-smi shows no drop;
//   oom.giveback (plain) cudaFree gives the memory back: nvidia-smi drops by
//                the freed bytes within the tolerance;
//   oom.trim     (pool, VPMM_DUMP) `vpmm-dump --trim PID`: the bytes it
//                reports released are exactly the drop of mapped, mapped falls
//                back to at most the start's plus one page, and nvidia-smi
//                drops by the released bytes within the tolerance.
// Exit status: 0 when no check failed. EXPECT_POOL=1 requires the pool.
// VPMM_DUMP: path of vpmm-dump. Build: nvcc -O2 -std=c++17 oom.cu.
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <sys/stat.h>
#include <algorithm>
#include <vector>

#include "reliability.h"

// ---- the shim's stderr, captured -----------------------------------------------------
//
// fd 2 goes to a file while the GPU fills, so that the lines written during
// each call can be read back right after it (the shim writes its log with
// write(2), synchronously, inside the failing call). Everything is copied to
// the real stderr at the end. The program itself prints on stdout only.
struct capture {
	int fd = -1, saved = -1;
	char path[64] = "";

	bool start()
	{
		snprintf(path, sizeof path, "/tmp/vpmm-oom-stderr-XXXXXX");
		fd = mkstemp(path);
		if (fd < 0)
			return false;
		fcntl(fd, F_SETFL, O_APPEND);
		saved = dup(2);
		if (saved < 0 || dup2(fd, 2) < 0)
			return false;
		printf("stderr captured in %s until the end\n", path);
		return true;
	}
	off_t size() const
	{
		struct stat st;
		return fd >= 0 && fstat(fd, &st) == 0 ? st.st_size : 0;
	}
	std::string since(off_t off) const
	{
		std::string s;
		off_t end = size();
		if (end > off) {
			s.resize((size_t)(end - off));
			ssize_t n = pread(fd, &s[0], s.size(), off);
			s.resize(n > 0 ? (size_t)n : 0);
		}
		return s;
	}
	void stop()
	{
		if (fd < 0)
			return;
		std::string all = since(0);
		dup2(saved, 2);
		close(saved);
		close(fd);
		unlink(path);
		fd = -1;
		if (!all.empty() && write(2, all.data(), all.size()) < 0)
			perror("write");
	}
};

// Out-of-memory lines the shim shows before it rate-limits them
// (VPMM_LOG_BURST, shim/shim.h).
#define OOM_LOG_BURST 5

// The sizes named by the shim's out-of-memory lines in `text`.
static std::vector<unsigned long long> oom_lines(const std::string &text)
{
	static const char key[] = "out of memory: requested ";
	std::vector<unsigned long long> v;
	for (size_t at = text.find(key); at != std::string::npos; at = text.find(key, at + 1))
		v.push_back(strtoull(text.c_str() + at + sizeof key - 1, NULL, 10));
	return v;
}

struct chunk {
	void *p;
	size_t bytes;
	uint64_t seed;
};

static struct capture cap;
static void cap_stop(void)
{
	cap.stop(); // also when a CK() leaves early: the shim's lines stay visible
}

static struct shim_api api;
static bool pool;
static struct mismatch *d_m, *h_m;

static std::string stats_now(void)
{
	std::string s;
	if (!shim_stats(&api, &s)) {
		printf("FAIL the pool's stats are not readable\n");
		exit(1);
	}
	return s;
}

// Verifies every chunk; returns the bad words.
static unsigned long long verify(const std::vector<chunk> &cs)
{
	CK(cudaMemset(d_m, 0, sizeof *d_m));
	for (size_t i = 0; i < cs.size(); i++)
		check_async(cs[i].p, cs[i].bytes, cs[i].seed, i, d_m, 0);
	CK(cudaGetLastError());
	CK(cudaMemcpy(h_m, d_m, sizeof *h_m, cudaMemcpyDeviceToHost));
	if (h_m->count)
		printf("  %llu bad words; first in chunk %llu (%llu bytes) at word %llu: 0x%08x, expected 0x%08x\n",
		       h_m->count, h_m->serial, h_m->bytes, h_m->index, h_m->got, h_m->want);
	return h_m->count;
}

static double tol_mib(double mib_compared)
{
	return env_double("OOM_TOL_MIB", 64) + env_double("OOM_TOL_FRAC", 0.0025) * mib_compared;
}

// Compares an nvidia-smi difference with the bytes it should be.
static void compare_smi(const char *name, const char *what, long smi_a, long smi_b,
			double expect_bytes)
{
	if (smi_a < 0 || smi_b < 0) {
		report(name, "SKIP", "nvidia-smi gave no figure");
		return;
	}
	double d = (double)(smi_b - smi_a), e = mib(expect_bytes), t = tol_mib(std::max(fabs(d), fabs(e)));
	report(name, fabs(d - e) <= t ? "PASS" : "FAIL",
	       "%s: nvidia-smi %+.0f MiB, expected %+.1f MiB, off by %.1f MiB (tolerance %.1f MiB; %s)",
	       what, d, e, d - e, t, smi_source_name());
}

// Runs vpmm-dump; false (with a message) when it fails.
static bool vpmm_dump(const char *dump, const char *args, std::string *out)
{
	char cmd[1024];
	snprintf(cmd, sizeof cmd, "'%s' %s 2>&1", dump, args);
	if (run_capture(cmd, out))
		return true;
	printf("  %s failed: %s\n", cmd, out->c_str());
	return false;
}

int main(void)
{
	const bool expect_pool = getenv("EXPECT_POOL") && !strcmp(getenv("EXPECT_POOL"), "1");
	const char *dump = getenv("VPMM_DUMP");
	const bool release_set = getenv("VPMM_RELEASE_THRESHOLD") && *getenv("VPMM_RELEASE_THRESHOLD");
	const int pid = (int)getpid();
	char args[128];

	setvbuf(stdout, NULL, _IOLBF, 0);
	api = shim_lookup();
	CK(cudaSetDevice(0));
	CK(cudaFree(0));
	pool = api.active && api.active();
	printf("oom: pid %d, %s\n", pid, pool ? "allocations go to the libvpmm pool" : "plain CUDA (no pool)");
	if (expect_pool && !pool) {
		report("oom.setup", "FAIL", "EXPECT_POOL=1 but libvpmm's pool is not active");
		return 1;
	}
	const std::string uuid = device_uuid(0);

	// Warm up: the kernels' module loaded, the pool created, one launch
	// done; all of it is in the baseline below.
	CK(cudaMalloc(&d_m, sizeof *d_m));
	CK(cudaMallocHost(&h_m, sizeof *h_m));
	{
		std::vector<chunk> w(1, chunk{nullptr, MiB, 7});
		CK(cudaMalloc(&w[0].p, MiB));
		fill_async(w[0].p, MiB, 7, 0);
		CK(cudaGetLastError());
		if (verify(w)) {
			report("oom.setup", "FAIL", "a 1 MiB buffer did not hold its pattern");
			return 1;
		}
		CK(cudaFree(w[0].p));
	}
	// The stream the recovery uses, made now and used once: on a full
	// device only allocations are under test, not stream creation.
	cudaStream_t rs;
	CK(cudaStreamCreateWithFlags(&rs, cudaStreamNonBlocking));
	{
		void *p;
		CK(cudaMallocAsync(&p, MiB, rs));
		CK(cudaFreeAsync(p, rs));
		CK(cudaStreamSynchronize(rs));
	}
	CK(cudaDeviceSynchronize());

	size_t free0, total;
	CK(cudaMemGetInfo(&free0, &total));
	std::string st0 = pool ? stats_now() : "";
	const unsigned long long mapped0 = pool ? stat_field(st0, "mapped") : 0;
	const unsigned long long page = pool ? stat_field(st0, "page_size") : 2 * MiB;
	const long smi0 = smi_used_mib(uuid);
	printf("start: device total %.0f MiB, free %.0f MiB; pool mapped %.1f MiB; %s %ld MiB\n",
	       mib(total), mib(free0), mib(mapped0), smi_source_name(), smi0);

	// ---- fill ---------------------------------------------------------------------------
	atexit(cap_stop);
	if (pool && !cap.start()) {
		report("oom.setup", "FAIL", "cannot capture stderr: %s", strerror(errno));
		return 1;
	}
	std::vector<chunk> chunks;
	std::vector<size_t> sizes; // every successful size, in order
	size_t filled = 0, failures = 0, bad_error = 0, sticky = 0, log_bad = 0, lines_total = 0;
	double slowest_failure = 0;
	uint64_t seed = 1000;
	bool runaway = false;
	for (size_t level = GiB; level >= 2 * MiB && !runaway; level /= 2) {
		for (;;) {
			unsigned long long fails_before = 0, fails_after = 0;
			if (pool)
				fails_before = stat_field(stats_now(), "failures");
			off_t off = cap.size();
			void *p = nullptr;
			double t0 = now_s();
			cudaError_t e = cudaMalloc(&p, level);
			double dt = now_s() - t0;
			std::vector<unsigned long long> lines = oom_lines(cap.since(off));
			if (pool)
				fails_after = stat_field(stats_now(), "failures");
			if (e == cudaSuccess) {
				if (!lines.empty()) {
					printf("  an out-of-memory line during a successful cudaMalloc(%zu)\n", level);
					log_bad++;
				}
				chunks.push_back(chunk{p, level, seed++});
				sizes.push_back(level);
				fill_async(p, level, chunks.back().seed, 0);
				CK(cudaGetLastError());
				filled += level;
				if (filled > total) { // the device cannot hold this: nothing fails
					printf("  %zu bytes allocated on a device of %zu and no failure\n", filled, total);
					runaway = true;
					break;
				}
				continue;
			}
			failures++;
			slowest_failure = std::max(slowest_failure, dt);
			printf("cudaMalloc(%zu) failed after %.1f MiB: %s (%.2f ms); %zu out-of-memory line(s)\n",
			       level, mib(filled), cudaGetErrorName(e), dt * 1e3, lines.size());
			if (e != cudaErrorMemoryAllocation)
				bad_error++;
			cudaError_t last = cudaGetLastError();
			if (last != cudaSuccess && last != cudaErrorMemoryAllocation) {
				printf("  cudaGetLastError after it: %s\n", cudaGetErrorName(last));
				bad_error++;
			}
			if (cudaPeekAtLastError() != cudaSuccess) {
				printf("  sticky: cudaPeekAtLastError still %s\n",
				       cudaGetErrorName(cudaPeekAtLastError()));
				sticky++;
			}
			if (pool) {
				lines_total += lines.size();
				bool sizes_ok = true;
				for (unsigned long long n : lines)
					sizes_ok &= n == level;
				// The shim shows the first OOM_LOG_BURST failures' lines,
				// then at most one a second (with the count of the others):
				// never more than one a failure, each naming its size.
				bool shown_all = failures <= OOM_LOG_BURST;
				if (!sizes_ok || lines.size() > fails_after - fails_before ||
				    (shown_all && lines.size() != fails_after - fails_before)) {
					printf("  log: %zu line(s), pool failures +%llu, sizes %s\n", lines.size(),
					       fails_after - fails_before, sizes_ok ? "right" : "wrong");
					log_bad++;
				}
			}
			break;
		}
	}
	CK(cudaDeviceSynchronize());
	size_t free_full, total_full;
	CK(cudaMemGetInfo(&free_full, &total_full));
	report("oom.fill",
	       !runaway && failures && filled >= (1 - env_double("OOM_FILL_TOL", 0.03)) * free0 ? "PASS" : "FAIL",
	       "%.1f MiB in %zu chunks = %.2f%% of the %.1f MiB free at the start (at least %.0f%%); "
	       "%zu failed calls, slowest %.2f ms; cudaMemGetInfo free when full %.1f MiB",
	       mib(filled), chunks.size(), 100.0 * filled / free0, mib(free0),
	       100 * (1 - env_double("OOM_FILL_TOL", 0.03)), failures, slowest_failure * 1e3,
	       mib(free_full));
	report("oom.error", failures && !bad_error && !sticky ? "PASS" : "FAIL",
	       "%zu failures, %zu not cudaErrorMemoryAllocation, %zu sticky", failures, bad_error, sticky);
	if (pool) {
		// lines written outside any cudaMalloc call count too
		size_t all = oom_lines(cap.since(0)).size();
		report("oom.log",
		       !log_bad && all == lines_total &&
				       lines_total >= std::min(failures, (size_t)OOM_LOG_BURST) &&
				       lines_total <= failures
			       ? "PASS" : "FAIL",
		       "%zu failed calls, %zu out-of-memory lines during them, %zu in all, %zu calls wrong",
		       failures, lines_total, all, log_bad);
	} else {
		report("oom.log", "SKIP", "no pool: the line is the shim's");
	}

	// ---- recover on the full device --------------------------------------------------------
	{
		size_t given = 0;
		while (!chunks.empty() && given < 64 * MiB) {
			given += chunks.back().bytes;
			CK(cudaFree(chunks.back().p));
			chunks.pop_back();
		}
		cudaStream_t s = rs;
		void *a = nullptr, *b = nullptr;
		std::vector<chunk> two;
		cudaError_t ea = cudaMalloc(&a, MiB);
		cudaError_t eb = cudaMallocAsync(&b, MiB, s);
		if (ea == cudaSuccess) {
			fill_async(a, MiB, 11, s);
			two.push_back(chunk{a, MiB, 11});
		}
		if (eb == cudaSuccess) {
			fill_async(b, MiB, 12, s);
			two.push_back(chunk{b, MiB, 12});
		}
		bool ok = cudaStreamSynchronize(s) == cudaSuccess;
		unsigned long long bad = verify(two);
		cudaError_t last = cudaGetLastError();
		if (eb == cudaSuccess)
			CK(cudaFreeAsync(b, s));
		if (ea == cudaSuccess)
			CK(cudaFree(a));
		CK(cudaStreamSynchronize(s));
		CK(cudaDeviceSynchronize());
		report("oom.recover",
		       ok && ea == cudaSuccess && eb == cudaSuccess && !bad && last == cudaSuccess ? "PASS" : "FAIL",
		       "after freeing %.0f MiB: cudaMalloc %s, cudaMallocAsync %s, kernels %s, "
		       "cudaGetLastError %s",
		       mib(given), cudaGetErrorName(ea), cudaGetErrorName(eb), bad ? "wrong data" : "ok",
		       cudaGetErrorName(last));
	}
	{
		unsigned long long bad = verify(chunks);
		size_t bytes = 0;
		for (auto &c : chunks)
			bytes += c.bytes;
		report("oom.data", bad ? "FAIL" : "PASS", "%zu chunks (%.1f MiB) verified: %llu bad words",
		       chunks.size(), mib(bytes), bad);
	}

	// ---- free everything, allocate it all again ---------------------------------------------
	for (auto &c : chunks)
		CK(cudaFree(c.p));
	chunks.clear();
	CK(cudaDeviceSynchronize());
	std::string st_before = pool ? stats_now() : "";
	off_t off = cap.size();
	size_t refused = 0, held = 0;
	for (size_t n : sizes) {
		void *p = nullptr;
		cudaError_t e = cudaMalloc(&p, n);
		if (e != cudaSuccess) {
			if (!refused++)
				printf("refill: cudaMalloc(%zu) failed after %.1f MiB: %s\n", n, mib(held),
				       cudaGetErrorName(e));
			cudaGetLastError();
			continue;
		}
		chunks.push_back(chunk{p, n, seed++});
		fill_async(p, n, chunks.back().seed, 0);
		CK(cudaGetLastError());
		held += n;
	}
	CK(cudaDeviceSynchronize());
	{
		unsigned long long bad = verify(chunks);
		size_t lines = oom_lines(cap.since(off)).size();
		if (pool) {
			std::string st = stats_now();
			unsigned long long created = stat_field(st, "pages_created") -
						     stat_field(st_before, "pages_created");
			unsigned long long failed = stat_field(st, "failures") - stat_field(st_before, "failures");
			report("oom.refill", !refused && !bad && !created && !failed && !lines ? "PASS" : "FAIL",
			       "%zu of %zu allocations (%.1f MiB) failed; pool: %llu pages created, %llu failures, "
			       "%zu out-of-memory lines; %llu bad words",
			       refused, sizes.size(), mib(held), created, failed, lines, bad);
		} else {
			report("oom.refill", !refused && !bad ? "PASS" : "FAIL",
			       "%zu of %zu allocations failed, %.1f MiB held; %llu bad words", refused,
			       sizes.size(), mib(held), bad);
		}
	}

	// ---- while holding it: vpmm-dump and nvidia-smi ----------------------------------------
	std::string st_hold = pool ? stats_now() : "";
	const unsigned long long mapped_hold = pool ? stat_field(st_hold, "mapped") : 0;
	const long smi_hold = smi_used_mib(uuid);
	if (pool && dump) {
		std::string out;
		unsigned long long dm = 0, dl = 0;
		snprintf(args, sizeof args, "--json %d", pid);
		bool ok = vpmm_dump(dump, args, &out);
		size_t at = out.find("\"stats\"");
		ok = ok && at != std::string::npos && json_u64(out, "mapped", &dm, at) &&
		     json_u64(out, "live", &dl, at);
		report("oom.dump", ok && dm == mapped_hold && dl == stat_field(st_hold, "live") ? "PASS" : "FAIL",
		       "vpmm-dump mapped %llu live %llu; the process's own stats: mapped %llu live %llu", dm, dl,
		       mapped_hold, stat_field(st_hold, "live"));
	} else {
		report("oom.dump", "SKIP", pool ? "VPMM_DUMP not set" : "no pool");
	}
	// what nvidia-smi should have seen grow since the start
	const double grown = pool ? (double)mapped_hold - (double)mapped0 : (double)held;
	compare_smi("oom.smi", pool ? "pool mapped growth" : "bytes cudaMalloc handed out", smi0, smi_hold,
		    grown);

	// ---- give it back ------------------------------------------------------------------
	for (auto &c : chunks)
		CK(cudaFree(c.p));
	chunks.clear();
	CK(cudaDeviceSynchronize());
	const long smi_freed = smi_used_mib(uuid);
	if (!pool) {
		compare_smi("oom.giveback", "after cudaFree of everything", smi_hold, smi_freed, -(double)held);
		report("oom.trim", "SKIP", "no pool");
	} else {
		std::string st_freed = stats_now();
		const unsigned long long mapped_freed = stat_field(st_freed, "mapped");
		if (release_set) {
			report("oom.keep", "SKIP", "VPMM_RELEASE_THRESHOLD is set: free memory is released");
		} else {
			report("oom.keep", mapped_freed == mapped_hold ? "PASS" : "FAIL",
			       "after freeing everything mapped %.1f MiB (was %.1f MiB)", mib(mapped_freed),
			       mib(mapped_hold));
			compare_smi("oom.keep.smi", "after freeing everything, before the trim", smi_hold,
				    smi_freed, 0);
		}
		if (!dump) {
			report("oom.trim", "SKIP", "VPMM_DUMP not set");
		} else {
			// Pages still mapped at an old address (zombies) are not
			// released: let the pool's thread unmap them first.
			for (double t0 = now_s(); now_s() - t0 < 5;) {
				st_freed = stats_now();
				if (!stat_field(st_freed, "zombies"))
					break;
				usleep(10000);
			}
			const unsigned long long before = stat_field(st_freed, "mapped");
			std::string out;
			unsigned long long released = 0;
			snprintf(args, sizeof args, "--trim %d", pid);
			bool ok = vpmm_dump(dump, args, &out) &&
				  sscanf(out.c_str(), "released %llu bytes", &released) == 1;
			const long smi_trim = smi_used_mib(uuid);
			std::string st = stats_now();
			const unsigned long long after = stat_field(st, "mapped");
			report("oom.trim",
			       ok && released == before - after && after <= mapped0 + page ? "PASS" : "FAIL",
			       "released %llu bytes (%.1f MiB); mapped %.1f -> %.1f MiB (at the start %.1f MiB, "
			       "one page %.0f MiB); zombies left %llu",
			       released, mib(released), mib(before), mib(after), mib(mapped0), mib(page),
			       stat_field(st_freed, "zombies"));
			compare_smi("oom.trim.smi", "after vpmm-dump --trim", smi_freed, smi_trim,
				    -(double)released);
		}
	}

	cudaError_t last = cudaGetLastError();
	cudaError_t sync = cudaDeviceSynchronize();
	CK(cudaStreamDestroy(rs));
	CK(cudaFree(d_m));
	CK(cudaFreeHost(h_m));
	cap.stop();
	report("oom.end", last == cudaSuccess && sync == cudaSuccess ? "PASS" : "FAIL",
	       "cudaGetLastError %s, cudaDeviceSynchronize %s", cudaGetErrorName(last), cudaGetErrorName(sync));
	printf("oom: %s (%d check(s) failed)\n", g_failed_checks ? "FAIL" : "PASS", g_failed_checks);
	return g_failed_checks ? 1 : 0;
}
