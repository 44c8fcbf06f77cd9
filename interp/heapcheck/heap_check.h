/* servd's heap checker (libservd_heapcheck.so): a checking malloc for SERVD_HEAP_CHECK=1.
 *
 * Every link-map namespace has its own libc and heap; a block allocated by one and freed (or
 * realloc'd) by another corrupts both, and the damage shows up later in whoever allocates next.
 * One copy of this library sits in front of each heap: LD_PRELOAD for the main program (the
 * interpreter early init re-executes with it), and in every interpreter namespace dlmopen'd
 * first, before libpython, so that the namespace's libc and everything loaded after bind their
 * malloc to it (the first object of a namespace is that namespace's global scope).
 *
 * Each copy tags its blocks with a 32-byte header naming its heap; the moment a copy is asked to
 * free, realloc or size a block of another heap (or of no checked heap), the process aborts with a
 * report naming both heaps and a backtrace. Blocks come from the copy's own libc (__libc_malloc and
 * friends), so the heaps stay separate exactly as without the checker. */
#ifndef SERVD_HEAP_CHECK_H
#define SERVD_HEAP_CHECK_H

#include <stddef.h>

/* The library's exported calls, found with dlsym in its own namespace (one copy per heap). */
#define SERVD_HEAP_CHECK_NAME_FN "servd_heap_check_set_name"
#define SERVD_HEAP_CHECK_OWNER_FN "servd_heap_check_owner"

/* Names this copy's heap in reports (copied, at most 63 bytes). Until then: "main program" for the
 * copy in the main namespace, "namespace heap @<address>" for others. */
void servd_heap_check_set_name(const char *name);
/* The name of the heap that allocated p (a live block of any checked heap), "" when p is no such
 * block. Borrowed, valid while that heap's library is loaded (always: namespaces stay loaded). */
const char *servd_heap_check_owner(const void *p);

#endif
