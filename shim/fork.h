/* fork.h — a forked child's fresh start (fork.c). Includes nothing. */
#ifndef VPMM_FORK_H
#define VPMM_FORK_H

/* Registers the child's handler once (process.c calls it under its lock,
 * when the shim becomes active). */
void vpmm_fork_watch(void);

#endif
