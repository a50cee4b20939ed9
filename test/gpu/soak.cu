// soak.cu — the five-minute soak: several threads,
// each with its own stream, allocate, write and verify data for DURATION
// seconds while the pool defragments; mapped memory and host RSS stay flat,
// nothing is lost. An unmodified CUDA program: it runs with and without
// libvpmm.so (scripts/gpu-reliability.sh runs a short plain run first, which
// shows that the program and its data checks are right on CUDA itself).
//
// Each thread draws sizes log-uniformly from SOAK_MIN to SOAK_MAX (4 KiB to
// 256 MiB: a quarter of them under the pool's 64 KiB grain, so size classes
// are exercised too) with a fixed seed of its own, allocates with
// cudaMallocAsync on its stream or, one time in SOAK_SYNC_EVERY, with
// cudaMalloc, and fills the buffer with a pattern of (thread, serial) by a
// kernel. It keeps at most SOAK_LIVE bytes live (default 1.5 GiB; 12 GiB for
// 8 threads) by freeing buffers at random, and frees one more at random a
// quarter of the time. Before every free a kernel verifies the pattern; the
// free (cudaFreeAsync, or cudaFree for cudaMalloc's buffers) follows at once,
// so stream order alone protects the memory the verification still reads.
// Frees at random positions leave free memory scattered between live
// buffers and across streams: requests of up to 256 MiB then need the pool
// to remap free pages (defragment) rather than find them contiguous.
//
// Every SOAK_SAMPLE seconds (10, or a tenth of a shorter run) one line: the
// pool's mapped bytes and peak, live and reusable bytes, zombies,
// defragmentations and pages remapped (from libvpmm's vpmm_shim_stats_json,
// found with dlsym), the program's own live bytes, host RSS
// (/proc/self/statm), operations. With VPMM_DUMP (vpmm-dump)
// and SOAK_DUMP_DIR set, `vpmm-dump --json` of this process is written there
// every SOAK_DUMP_EVERY samples while the threads run (soak-run-K.json), once
// with every thread paused and the device idle, buffers held
// (soak-quiet-held.json), and once after everything was freed
// (soak-quiet-freed.json); test/gpu/dump_check.py checks them.
//
// The checks (one "check NAME:" line each, reliability.h):
//   soak.data    no verification found a bad word; every buffer was freed,
//                and verified before (those left at the end too);
//   soak.errors  no CUDA call failed, cudaGetLastError clean on every thread;
//   soak.count   (pool) the pool counted exactly the program's allocations and
//                frees during the run, and no failure: nothing lost, nothing
//                served elsewhere;
//   soak.defrag  (pool) defragmentations during the run, and pages remapped
//                after the warm-up: the run did exercise remapping;
//   soak.mapped  (pool) after the warm-up (the first SOAK_WARMUP = 20 % of the
//                run) mapped bytes, peaks between samples included, stay at
//                most SOAK_MAPPED_FACTOR (1.25) times the program's highest
//                live bytes. Why 1.25: the worst peak used / peak live ratio
//                measured through the pool on the GPU is 1.063
//                (scratch_streams, four streams, docs/performance.md); eight streams of random sizes
//                are harsher, and a leak of one average buffer (~23 MiB) per
//                second after the warm-up (> 5 GiB) would still cross it;
//   soak.flat    (pool) no upward trend: the highest mapped bytes of the
//                second half of the run are at most the highest of the
//                window from the warm-up to the half, plus SOAK_GROWTH_TOL
//                (5 %);
//   soak.rss     host RSS grows by at most SOAK_RSS_SLACK (64 MiB) from the
//                end of the warm-up to the end;
//   soak.check   the pool's own invariant check, if libvpmm exports one
//                (vpmm_shim_check(int device, FILE *log): broken invariants,
//                or a negative errno); SKIP otherwise — the region maps of
//                vpmm-dump are checked by the script instead.
// Exit status: 0 when no check failed. EXPECT_POOL=1 requires the pool.
// Duration: argv[1] or SOAK_DURATION (seconds, default 300).
// Build: nvcc -O2 -std=c++17 soak.cu.
#include <math.h>
#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <random>
#include <thread>
#include <vector>

#include "reliability.h"

struct config {
	double duration, sample, warmup, factor, growth_tol;
	int threads, sync_every, dump_every;
	size_t live, min, max, rss_slack;
	uint64_t seed;
	const char *dump, *dump_dir;
};
static struct config C;

// ---- what the threads share ----------------------------------------------------------
static std::atomic<bool> g_stop{false};
static std::atomic<long long> g_live{0}, g_live_hwm{0};
static std::atomic<unsigned long long> g_allocs{0}, g_frees{0}, g_sync_allocs{0}, g_ops{0},
	g_verified{0}, g_bad_words{0}, g_api_errors{0}, g_thread_errors{0};
static std::mutex g_msg_lock;

static void fail_msg(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static void fail_msg(const char *fmt, ...)
{
	char buf[1024];
	va_list ap;
	va_start(ap, fmt);
	vsnprintf(buf, sizeof buf, fmt, ap);
	va_end(ap);
	std::lock_guard<std::mutex> g(g_msg_lock);
	printf("FAIL %s\n", buf);
	fflush(stdout);
	g_stop = true;
}

// The threads pause here once the time is up, so that the main thread can
// look at the pool with every buffer still held and nothing running.
static std::mutex g_bar_lock;
static std::condition_variable g_bar_cv;
static int g_parked;
static bool g_resume;

static void park(void)
{
	std::unique_lock<std::mutex> g(g_bar_lock);
	g_parked++;
	g_bar_cv.notify_all();
	g_bar_cv.wait(g, [] { return g_resume; });
}

struct buf {
	void *p;
	size_t bytes;
	uint64_t serial, seed;
	bool sync;
};

#define TCK(call, what)                                                       \
	({                                                                    \
		cudaError_t e_ = (call);                                      \
		if (e_ != cudaSuccess) {                                      \
			g_api_errors++;                                       \
			fail_msg("thread %d: %s: %s (%s)", t, #call, cudaGetErrorString(e_), what); \
		}                                                             \
		e_ == cudaSuccess;                                            \
	})

static void worker(int t)
{
	cudaStream_t s;
	struct mismatch *dm = nullptr, *hm = nullptr;
	std::vector<buf> live;
	size_t live_bytes = 0;
	uint64_t serial = 0;
	std::mt19937_64 rng(C.seed * 1000003u + (uint64_t)t);
	std::uniform_real_distribution<double> logsize(log((double)C.min), log((double)C.max));
	const double deadline = now_s() + C.duration;
	double next_poll = 0;
	unsigned since_poll = 0;

	bool ok = TCK(cudaSetDevice(0), "setup") &&
		  TCK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "setup") &&
		  TCK(cudaMalloc(&dm, sizeof *dm), "setup") &&
		  TCK(cudaMallocHost(&hm, sizeof *hm), "setup") &&
		  TCK(cudaMemsetAsync(dm, 0, sizeof *dm, s), "setup");
	if (!ok) {
		park();
		return;
	}
	g_allocs++;

	// Reads what the verifications found so far (waits for the stream).
	auto poll = [&]() {
		if (!TCK(cudaMemcpyAsync(hm, dm, sizeof *hm, cudaMemcpyDeviceToHost, s), "poll") ||
		    !TCK(cudaStreamSynchronize(s), "poll"))
			return;
		if (hm->count) {
			g_bad_words += hm->count;
			fail_msg("thread %d: %llu bad word(s); first in buffer %llu (%llu bytes) at word %llu: "
				 "0x%08x, expected 0x%08x",
				 t, hm->count, hm->serial, hm->bytes, hm->index, hm->got, hm->want);
			hm->count = 0;
			TCK(cudaMemsetAsync(dm, 0, sizeof *dm, s), "poll");
		}
		since_poll = 0;
		next_poll = now_s() + 0.25;
	};
	auto free_one = [&](size_t i) {
		buf b = live[i];
		check_async(b.p, b.bytes, b.seed, b.serial, dm, s);
		TCK(cudaGetLastError(), "verify kernel");
		if (b.sync)
			TCK(cudaFree(b.p), "free");
		else
			TCK(cudaFreeAsync(b.p, s), "free");
		live[i] = live.back();
		live.pop_back();
		live_bytes -= b.bytes;
		g_live -= (long long)b.bytes;
		g_frees++;
		g_verified += b.bytes;
		g_ops++;
	};

	while (!g_stop && now_s() < deadline) {
		size_t bytes = (size_t)exp(logsize(rng)) & ~(size_t)3;
		bytes = std::max(bytes, C.min);
		while (!live.empty() && live_bytes + bytes > C.live)
			free_one(rng() % live.size());
		if (!live.empty() && rng() % 4 == 0)
			free_one(rng() % live.size());
		buf b{nullptr, bytes, serial, ((uint64_t)(t + 1) << 48) ^ (C.seed << 32) ^ serial,
		      rng() % (unsigned)C.sync_every == 0};
		serial++;
		cudaError_t e = b.sync ? cudaMalloc(&b.p, bytes) : cudaMallocAsync(&b.p, bytes, s);
		if (e != cudaSuccess) {
			g_api_errors++;
			fail_msg("thread %d: %s(%zu) failed: %s; this thread holds %zu bytes in %zu buffers, "
				 "all threads %lld",
				 t, b.sync ? "cudaMalloc" : "cudaMallocAsync", bytes, cudaGetErrorName(e),
				 live_bytes, live.size(), (long long)g_live);
			break;
		}
		fill_async(b.p, bytes, b.seed, s);
		if (!TCK(cudaGetLastError(), "fill kernel"))
			break;
		live.push_back(b);
		live_bytes += bytes;
		long long now_live = (g_live += (long long)bytes);
		for (long long h = g_live_hwm; now_live > h && !g_live_hwm.compare_exchange_weak(h, now_live);)
			;
		g_allocs++;
		g_sync_allocs += b.sync;
		g_ops++;
		if (++since_poll >= 64 || now_s() >= next_poll)
			poll();
	}
	poll();
	TCK(cudaStreamSynchronize(s), "pause");
	park();

	// Everything left is verified, then freed.
	while (!live.empty())
		free_one(live.size() - 1);
	poll();
	if (cudaGetLastError() != cudaSuccess)
		g_thread_errors++;
	if (TCK(cudaFree(dm), "end"))
		g_frees++;
	TCK(cudaFreeHost(hm), "end");
	TCK(cudaStreamDestroy(s), "end");
}

// ---- samples ---------------------------------------------------------------------------

struct sample {
	double t;
	bool pool;
	unsigned long long mapped, mapped_peak, live, reusable, zombies, defrags, remapped;
	long long prog_live;
	size_t rss, dev_used;
	unsigned long long ops;
};

static size_t rss_bytes(void)
{
	unsigned long size = 0, resident = 0;
	FILE *f = fopen("/proc/self/statm", "r");
	if (!f)
		return 0;
	if (fscanf(f, "%lu %lu", &size, &resident) != 2)
		resident = 0;
	fclose(f);
	return resident * (size_t)sysconf(_SC_PAGESIZE);
}

static struct shim_api api;

static sample take(double t0)
{
	sample s{};
	std::string st;
	size_t fr = 0, tot = 0;
	s.t = now_s() - t0;
	s.pool = shim_stats(&api, &st);
	if (s.pool) {
		s.mapped = stat_field(st, "mapped");
		s.mapped_peak = stat_field(st, "mapped_peak");
		s.live = stat_field(st, "live");
		s.reusable = stat_field(st, "reusable");
		s.zombies = stat_field(st, "zombies");
		s.defrags = stat_field(st, "defrags");
		s.remapped = stat_field(st, "pages_remapped");
	}
	s.prog_live = g_live;
	s.rss = rss_bytes();
	if (cudaMemGetInfo(&fr, &tot) == cudaSuccess)
		s.dev_used = tot - fr;
	s.ops = g_ops;
	return s;
}

static void print_sample(const char *tag, const sample &s)
{
	if (s.pool)
		printf("%s t=%6.1fs mapped %9.1f MiB (peak %9.1f) live %9.1f reusable %8.1f zombies %7.1f "
		       "defrags %8llu remapped %9llu | program live %9.1f MiB | rss %7.1f MiB | ops %llu\n",
		       tag, s.t, mib(s.mapped), mib(s.mapped_peak), mib(s.live), mib(s.reusable),
		       mib(s.zombies), s.defrags, s.remapped, mib(s.prog_live), mib(s.rss), s.ops);
	else
		printf("%s t=%6.1fs (no pool) device used %9.1f MiB | program live %9.1f MiB | rss %7.1f MiB "
		       "| ops %llu\n",
		       tag, s.t, mib(s.dev_used), mib(s.prog_live), mib(s.rss), s.ops);
	fflush(stdout);
}

// vpmm-dump --json of this process into SOAK_DUMP_DIR/NAME.json.
static void dump_to(const char *name)
{
	char cmd[2048];
	std::string out;
	if (!C.dump || !C.dump_dir)
		return;
	snprintf(cmd, sizeof cmd, "'%s' --json %d > '%s/%s.json' 2>'%s/%s.err'", C.dump, (int)getpid(),
		 C.dump_dir, name, C.dump_dir, name);
	if (!run_capture(cmd, &out))
		printf("vpmm-dump into %s/%s.json failed (see %s.err)\n", C.dump_dir, name, name);
}

int main(int argc, char **argv)
{
	const bool expect_pool = getenv("EXPECT_POOL") && !strcmp(getenv("EXPECT_POOL"), "1");
	setvbuf(stdout, NULL, _IOLBF, 0);
	C.duration = argc > 1 ? atof(argv[1]) : env_double("SOAK_DURATION", 300);
	C.threads = (int)env_double("SOAK_THREADS", 8);
	C.live = env_size("SOAK_LIVE", 1536 * MiB);
	C.min = env_size("SOAK_MIN", 4 * KiB);
	C.max = env_size("SOAK_MAX", 256 * MiB);
	C.sample = env_double("SOAK_SAMPLE", std::min(10.0, C.duration / 10));
	C.warmup = env_double("SOAK_WARMUP", 0.2);
	C.factor = env_double("SOAK_MAPPED_FACTOR", 1.25);
	C.growth_tol = env_double("SOAK_GROWTH_TOL", 0.05);
	C.rss_slack = env_size("SOAK_RSS_SLACK", 64 * MiB);
	C.sync_every = (int)env_double("SOAK_SYNC_EVERY", 8);
	C.dump_every = (int)env_double("SOAK_DUMP_EVERY", 6);
	C.seed = (uint64_t)env_double("SOAK_SEED", 1);
	C.dump = getenv("VPMM_DUMP");
	C.dump_dir = getenv("SOAK_DUMP_DIR");
	if (C.dump && !*C.dump)
		C.dump = nullptr;
	if (C.dump_dir && !*C.dump_dir)
		C.dump_dir = nullptr;
	const double tw = C.warmup * C.duration, half = C.duration / 2;
	if (C.duration <= 0 || C.threads < 1 || C.sync_every < 1 || C.dump_every < 1 || C.min < 4 ||
	    C.max < C.min || C.live < C.max || C.sample <= 0 || tw >= half ||
	    C.sample > (half - tw) / 2) {
		printf("FAIL bad configuration: duration %.0f s, %d threads, sizes %zu..%zu, live %zu per "
		       "thread, sample every %.1f s, warm-up %.0f s: need live >= max >= min >= 4, warm-up "
		       "before the half, and two samples between them\n",
		       C.duration, C.threads, C.min, C.max, C.live, C.sample, tw);
		return 2;
	}

	api = shim_lookup();
	CK(cudaSetDevice(0));
	CK(cudaFree(0));
	const bool pool = api.active && api.active();
	if (expect_pool && !pool) {
		report("soak.setup", "FAIL", "EXPECT_POOL=1 but libvpmm's pool is not active");
		return 1;
	}
	size_t dev_free, dev_total;
	CK(cudaMemGetInfo(&dev_free, &dev_total));
	const double need = C.factor * (double)C.live * C.threads;
	printf("soak: pid %d, %s; %d threads x %.0f MiB live, sizes %zu..%zu bytes, %.0f s "
	       "(warm-up %.0f s, sample every %.0f s); device free %.0f of %.0f MiB\n",
	       (int)getpid(), pool ? "libvpmm pool" : "plain CUDA (no pool)", C.threads, mib(C.live), C.min,
	       C.max, C.duration, tw, C.sample, mib(dev_free), mib(dev_total));
	if (need > 0.9 * (double)dev_free) {
		printf("FAIL bad configuration: %d x %.0f MiB x %.2f does not fit the device's free memory\n",
		       C.threads, mib(C.live), C.factor);
		return 2;
	}

	// Warm up before the pool's counters are read: kernels loaded, the
	// pool created.
	{
		struct mismatch *m, hm;
		void *p;
		CK(cudaMalloc(&m, sizeof *m));
		CK(cudaMemset(m, 0, sizeof *m));
		CK(cudaMalloc(&p, MiB));
		fill_async(p, MiB, 5, 0);
		check_async(p, MiB, 5, 0, m, 0);
		CK(cudaGetLastError());
		CK(cudaMemcpy(&hm, m, sizeof hm, cudaMemcpyDeviceToHost));
		CK(cudaFree(p));
		CK(cudaFree(m));
		if (hm.count) {
			report("soak.setup", "FAIL", "a 1 MiB buffer did not hold its pattern");
			return 1;
		}
	}
	std::string st0;
	if (pool && !shim_stats(&api, &st0)) {
		report("soak.setup", "FAIL", "the pool's stats are not readable");
		return 1;
	}

	// ---- run ---------------------------------------------------------------------------
	const double t0 = now_s();
	std::vector<std::thread> th;
	std::vector<sample> samples;
	for (int i = 0; i < C.threads; i++)
		th.emplace_back(worker, i);
	for (int k = 1;; k++) {
		double at = t0 + k * C.sample;
		while (!g_stop && now_s() < at)
			usleep(20000);
		if (g_stop)
			break;
		samples.push_back(take(t0));
		print_sample("sample", samples.back());
		if (samples.back().t >= C.duration)
			break;
		if (k % C.dump_every == 0) {
			char name[64];
			snprintf(name, sizeof name, "soak-run-%03d", k);
			dump_to(name);
		}
	}
	{
		std::unique_lock<std::mutex> g(g_bar_lock);
		g_bar_cv.wait(g, [&] { return g_parked == C.threads; });
	}
	CK(cudaDeviceSynchronize());
	samples.push_back(take(t0));
	print_sample("paused", samples.back());
	std::string st_held;
	if (pool)
		shim_stats(&api, &st_held);
	dump_to("soak-quiet-held");
	{
		std::lock_guard<std::mutex> g(g_bar_lock);
		g_resume = true;
	}
	g_bar_cv.notify_all();
	for (auto &x : th)
		x.join();
	cudaError_t main_err = cudaGetLastError();
	CK(cudaDeviceSynchronize());
	const sample end = take(t0);
	print_sample("freed ", end);
	dump_to("soak-quiet-freed");

	// ---- checks -------------------------------------------------------------------------
	const double elapsed = samples.back().t;
	report("soak.data", !g_bad_words && g_allocs == g_frees ? "PASS" : "FAIL",
	       "%llu allocations (%llu with cudaMalloc), %llu frees, %.1f GiB verified, %llu bad words, "
	       "%.0f ops/s over %.0f s",
	       (unsigned long long)g_allocs, (unsigned long long)g_sync_allocs, (unsigned long long)g_frees,
	       (double)g_verified / GiB, (unsigned long long)g_bad_words, g_ops / elapsed, elapsed);
	report("soak.errors", !g_api_errors && !g_thread_errors && main_err == cudaSuccess ? "PASS" : "FAIL",
	       "%llu failed CUDA calls, %llu threads with a last error, main thread %s",
	       (unsigned long long)g_api_errors, (unsigned long long)g_thread_errors,
	       cudaGetErrorName(main_err));

	// RSS from the end of the warm-up on.
	{
		size_t base = 0, top = 0;
		bool have = false;
		for (auto &s : samples)
			if (s.t >= tw) {
				if (!have)
					base = s.rss;
				have = true;
				top = std::max(top, s.rss);
			}
		top = std::max(top, end.rss);
		report("soak.rss", have && top - base <= C.rss_slack ? "PASS" : "FAIL",
		       "host RSS %.1f MiB at the end of the warm-up, at most %.1f MiB after (+%.1f MiB, allowed "
		       "%.0f MiB)",
		       mib(base), mib(top), mib((double)top - (double)base), mib(C.rss_slack));
	}

	if (!pool) {
		const char *why = "no pool: mapped bytes are the pool's";
		report("soak.count", "SKIP", "%s", why);
		report("soak.defrag", "SKIP", "%s", why);
		report("soak.mapped", "SKIP", "%s", why);
		report("soak.flat", "SKIP", "%s", why);
		report("soak.check", "SKIP", "%s", why);
	} else {
		std::string st;
		if (!shim_stats(&api, &st)) {
			report("soak.count", "FAIL", "the pool's stats are not readable");
			return 1;
		}
		unsigned long long dm = stat_field(st, "mallocs") - stat_field(st0, "mallocs");
		unsigned long long df = stat_field(st, "frees") - stat_field(st0, "frees");
		unsigned long long dfail = stat_field(st, "failures") - stat_field(st0, "failures");
		report("soak.count", dm == g_allocs && df == g_frees && !dfail ? "PASS" : "FAIL",
		       "pool: %llu mallocs, %llu frees, %llu failures; program: %llu allocations, %llu frees",
		       dm, df, dfail, (unsigned long long)g_allocs, (unsigned long long)g_frees);

		// The sample at or just after the end of the warm-up.
		const sample *w = nullptr;
		for (auto &s : samples)
			if (s.t >= tw) {
				w = &s;
				break;
			}
		unsigned long long defrags = end.defrags - stat_field(st0, "defrags");
		unsigned long long remapped_after = w ? end.remapped - w->remapped : 0;
		report("soak.defrag", defrags && remapped_after ? "PASS" : "FAIL",
		       "%llu defragmentations in the run; %llu pages remapped after the warm-up (%llu in all)",
		       defrags, remapped_after, end.remapped - stat_field(st0, "pages_remapped"));

		// Highest mapped bytes of each window; a peak reached between two
		// samples belongs to the window of the later one.
		unsigned long long w1 = 0, w2 = 0, after_warm = 0;
		int n1 = 0, n2 = 0;
		for (size_t i = 0; i < samples.size(); i++) {
			const sample &s = samples[i];
			unsigned long long top = s.mapped;
			if (i && s.mapped_peak > samples[i - 1].mapped_peak)
				top = std::max(top, s.mapped_peak);
			if (s.t < tw)
				continue;
			after_warm = std::max(after_warm, top);
			if (s.t < half) {
				w1 = std::max(w1, top);
				n1++;
			} else {
				w2 = std::max(w2, top);
				n2++;
			}
		}
		const double bound = C.factor * (double)g_live_hwm;
		report("soak.mapped", n1 && n2 && after_warm <= bound ? "PASS" : "FAIL",
		       "mapped after the warm-up at most %.1f MiB = %.3f x the program's highest live %.1f MiB "
		       "(allowed %.2f x); pool live peak %.1f MiB",
		       mib(after_warm), (double)after_warm / (double)g_live_hwm, mib(g_live_hwm), C.factor,
		       mib(stat_field(st, "live_peak")));
		report("soak.flat", n1 && n2 && w2 <= (1 + C.growth_tol) * (double)w1 ? "PASS" : "FAIL",
		       "highest mapped %.1f MiB from %.0f s to %.0f s (%d samples), %.1f MiB in the second half "
		       "(%d samples): %+.2f%% (allowed %+.0f%%)",
		       mib(w1), tw, half, n1, mib(w2), n2, w1 ? 100.0 * ((double)w2 / (double)w1 - 1) : 0.0,
		       100 * C.growth_tol);

		long (*check)(int, FILE *);
		*(void **)&check = dlsym(RTLD_DEFAULT, "vpmm_shim_check");
		if (!check) {
			report("soak.check", "SKIP",
			       "libvpmm exports no vpmm_shim_check; the script checks vpmm-dump's region maps");
		} else {
			long bad = check(0, stdout);
			report("soak.check", bad == 0 ? "PASS" : "FAIL", "vpmm_shim_check: %ld", bad);
		}
		if (!st_held.empty())
			printf("stats with every buffer held: %s\nstats at the end: %s\n", st_held.c_str(), st.c_str());
	}
	printf("soak: %s (%d check(s) failed)\n", g_failed_checks ? "FAIL" : "PASS", g_failed_checks);
	return g_failed_checks ? 1 : 0;
}
