/* SERVD_HEAP_CHECK=1: the checking allocator (interp/heapcheck/heap_check.h) in front of every heap
 * of the process: LD_PRELOADed for the main program, loaded first into each interpreter namespace. */
#ifndef SERVD_INTERP_HEAP_CHECK_IMPL_H
#define SERVD_INTERP_HEAP_CHECK_IMPL_H

#include <dlfcn.h>
#include <stdbool.h>

bool servd_heap_check__on(void); /* SERVD_HEAP_CHECK=1 */
/* Early init: 1 when the checking mode is on and the main program's heap has no checker yet (then
 * LD_PRELOAD now names it, for the re-exec), 0 when nothing is to do, a negative code on failure. */
int servd_heap_check__preload_env(void);
/* Loads the checker as the first object of a new namespace (so that the libc and libpython loaded
 * there after it bind their malloc to it) and returns that namespace in *lmid; names both heaps. */
int servd_heap_check__open_ns(int slot, Lmid_t *lmid);

#endif
