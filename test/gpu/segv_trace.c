/* segv_trace.c — a preload for the GPU checks: on SIGSEGV, SIGBUS or
 * SIGABRT, the native stack of the thread that took it, written to stderr
 * (libraries with offsets: "libvpmm.so(+0x1a2b)"), then the signal's
 * default action. scripts/gpu-address.sh preloads it into the multi-GPU
 * runs and turns libvpmm.so's offsets into functions and lines with
 * addr2line. Python's faulthandler, enabled after it, prints the Python
 * stack first and then hands the signal on to this handler. */
#define _GNU_SOURCE
#include <execinfo.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char alt[64 * 1024];

/* write(2) of a string, in a handler: nothing that allocates or locks. */
static void say(const char *s)
{
	size_t n = strlen(s);
	while (n) {
		ssize_t w = write(2, s, n);
		if (w <= 0)
			return;
		s += w;
		n -= (size_t)w;
	}
}

/* v in decimal (base 10) or hexadecimal (16), without printf. */
static void say_num(unsigned long v, unsigned base)
{
	char b[24];
	int i = (int)sizeof b - 1;
	b[i] = '\0';
	do {
		b[--i] = "0123456789abcdef"[v % base];
		v /= base;
	} while (v && i > 0);
	say(b + i);
}

static void on_signal(int sig, siginfo_t *si, void *uc)
{
	void *frames[64];
	(void)uc;
	say("segv_trace: pid ");
	say_num((unsigned long)getpid(), 10);
	say(" signal ");
	say_num((unsigned long)sig, 10);
	say(" at address 0x");
	say_num(si ? (unsigned long)(uintptr_t)si->si_addr : 0, 16);
	say("\n");
	int depth = backtrace(frames, 64);
	backtrace_symbols_fd(frames, depth, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

__attribute__((constructor)) static void segv_trace_install(void)
{
	stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
	struct sigaction sa;
	void *warm[1];
	/* The first backtrace() loads libgcc_s, which allocates: done here, not
	 * in a handler that may run on a corrupted heap. */
	backtrace(warm, 1);
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_signal;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaltstack(&ss, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGABRT, &sa, NULL);
}
