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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static char alt[64 * 1024];

static void on_signal(int sig, siginfo_t *si, void *uc)
{
	char line[160];
	void *frames[64];
	(void)uc;
	int n = snprintf(line, sizeof line, "segv_trace: pid %d signal %d (%s) at address %p\n",
			 (int)getpid(), sig, strsignal(sig), si ? si->si_addr : NULL);
	if (n > 0 && write(2, line, (size_t)n) < 0)
		_exit(128 + sig);
	int depth = backtrace(frames, 64);
	backtrace_symbols_fd(frames, depth, 2);
	signal(sig, SIG_DFL);
	raise(sig);
}

__attribute__((constructor)) static void segv_trace_install(void)
{
	stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_sigaction = on_signal;
	sa.sa_flags = SA_SIGINFO | SA_ONSTACK;
	sigemptyset(&sa.sa_mask);
	sigaltstack(&ss, NULL);
	sigaction(SIGSEGV, &sa, NULL);
	sigaction(SIGBUS, &sa, NULL);
	sigaction(SIGABRT, &sa, NULL);
}
