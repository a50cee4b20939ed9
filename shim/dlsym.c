/* dlsym.c — the exported dlsym: an entry that asks vpmm_dlsym_filter
 * (wrap.c) and otherwise hands the lookup to glibc's dlsym untouched.
 *
 * Programs with the static runtime, CuPy, PyTorch and friends reach libcuda
 * by dlsym(handle, "cuGetProcAddress_v2") and then everything through it;
 * others dlsym entry points one by one. For the handful of names we wrap the
 * hook asks the real dlsym and, if the answer is one of libcuda's wrapped
 * entry points (the comparison is by pointer, see resolve.c), hands back our
 * wrapper instead. Whatever handle was used (libcuda's, RTLD_DEFAULT,
 * RTLD_NEXT) does not matter: only the answer does.
 *
 * Every other lookup must behave exactly as if we were not here, and glibc's
 * dlsym depends on who calls it: RTLD_NEXT means "after the caller's object"
 * (interposers chain to the next definition that way), and RTLD_DEFAULT
 * searches the caller's namespace. A C hook that calls the real dlsym would
 * make libvpmm the caller. So on x86-64 the exported entry
 * is a few instructions of assembly that keep the caller's return address on
 * the stack: it asks the C filter, returns the wrapper if there is one, and
 * otherwise jumps (not calls) to glibc's dlsym, which then sees the original
 * caller. Elsewhere a C fallback is used: it keeps the caller only where the
 * compiler turns its final call into a jump (GCC does at -O2), otherwise
 * RTLD_NEXT lookups are resolved as seen from libvpmm. The shim tests check
 * RTLD_NEXT from a program and from a library (drv_prog dlsym).
 *
 * Owns: the exported dlsym. May call: wrap.h (the filter), resolve.h
 * (glibc's dlsym).
 */
#include "resolve.h"
#include "shim.h"
#include "wrap.h"

#if defined(__x86_64__)
/* Stack on entry: return address at 0(%rsp), %rsp = 8 mod 16. Two pushes and
 * 8 bytes realign it for the call; the pops restore handle and name for the
 * tail jump. endbr64 is a no-op on processors without CET. */
__asm__(".text\n"
	".globl dlsym\n"
	".type dlsym, @function\n"
	".p2align 4\n"
	"dlsym:\n"
	"	.cfi_startproc\n"
	"	endbr64\n"
	"	pushq %rdi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	pushq %rsi\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	subq $8, %rsp\n"
	"	.cfi_adjust_cfa_offset 8\n"
	"	call vpmm_dlsym_filter\n"
	"	addq $8, %rsp\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq %rsi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	popq %rdi\n"
	"	.cfi_adjust_cfa_offset -8\n"
	"	testq %rax, %rax\n"
	"	jz 1f\n"
	"	ret\n"
	"1:	jmp *vpmm_real_dlsym_fn(%rip)\n"
	"	.cfi_endproc\n"
	".size dlsym, .-dlsym\n");
#else
void *dlsym(void *handle, const char *name) VPMM_EXPORT;
void *dlsym(void *handle, const char *name)
{
	void *w = vpmm_dlsym_filter(handle, name);
	return w ? w : vpmm_real_dlsym_fn(handle, name);
}
#endif
