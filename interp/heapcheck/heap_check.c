/* libservd_heapcheck.so: the malloc family with per-heap block tags (heap_check.h).
 *
 * Block layout: [raw ... | hdr (32 bytes) | user bytes], user 16-byte aligned (or as asked). hdr.tag
 * is TAG_LIVE ^ the owning heap's address, so a header of another copy, a freed block and bytes
 * that are no header at all are told apart by one compare each. Nothing here takes a lock or calls
 * stdio: the report is written with write(2) from a static buffer, since the heap may be the thing
 * that is broken. */
#include "heap_check.h"

#include <errno.h>
#include <execinfo.h>
#include <stdlib.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

/* This copy's libc (in its own namespace): the heap being checked. */
extern void *__libc_malloc(size_t);
extern void __libc_free(void *);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);

#define EXPORT __attribute__((visibility("default")))
#define TAG_LIVE 0x5e7dbeefc0ffee11ull
#define TAG_FREED 0xdeadf7eedeadf7eeull
#define HEAP_MAGIC 0x68656170636b3031ull /* "heapck01" */

typedef struct heap {
  uint64_t magic;
  char name[64];
} heap;

typedef struct hdr {
  uint64_t tag; /* TAG_LIVE ^ (uintptr_t)owner, TAG_FREED once freed */
  const heap *owner;
  size_t size; /* bytes asked for */
  void *raw;   /* what __libc_malloc returned */
} hdr;
_Static_assert(sizeof(hdr) == 32, "the header keeps 16-byte alignment");

static heap g_heap = {HEAP_MAGIC, ""};

static const char *heap_name(const heap *h) {
  if (h->name[0]) return h->name;
  return "(unnamed heap)";
}

/* ---- the report ---- */
static char g_buf[1024];
static size_t g_len;
static void put(const char *s) {
  size_t n = strlen(s);
  if (n > sizeof g_buf - g_len) n = sizeof g_buf - g_len;
  memcpy(g_buf + g_len, s, n);
  g_len += n;
}
static void put_hex(uintptr_t v) {
  char t[19] = "0x";
  int i = 2;
  for (int s = 60; s >= 0; s -= 4)
    if (v >> s || s == 0 || i > 2) t[i++] = "0123456789abcdef"[(v >> s) & 15];
  t[i] = 0;
  put(t);
}
static void put_dec(size_t v) {
  char t[24];
  int i = 23;
  t[i] = 0;
  do t[--i] = (char)('0' + v % 10);
  while ((v /= 10) && i > 0);
  put(t + i);
}

__attribute__((noreturn)) static void report(const char *call, const void *p, const hdr *h, const char *what) {
  g_len = 0;
  put("servd heap check: ");
  put(call);
  put("(");
  put_hex((uintptr_t)p);
  put(") in heap \"");
  put(heap_name(&g_heap));
  put("\": ");
  put(what);
  if (h && h->tag == (TAG_LIVE ^ (uintptr_t)h->owner)) {
    put(" \"");
    put(heap_name(h->owner));
    put("\" (");
    put_dec(h->size);
    put(" bytes)");
  }
  put("\nbacktrace (the freeing side; addresses of namespace libraries resolve with their maps):\n");
  ssize_t w = write(2, g_buf, g_len);
  void *frames[64];
  int n = backtrace(frames, 64); /* may load libgcc_s: we abort right after */
  backtrace_symbols_fd(frames, n, 2);
  (void)w;
  abort();
}

static hdr *header_of(const void *p) { return (hdr *)((uintptr_t)p - sizeof(hdr)); }

/* The header of p when it is a live block of this heap; reports anything else. */
static hdr *own(const char *call, void *p) {
  hdr *h = header_of(p);
  if (h->tag == (TAG_LIVE ^ (uintptr_t)&g_heap) && h->owner == &g_heap) return h;
  if (h->tag == (TAG_LIVE ^ (uintptr_t)h->owner) && h->owner && h->owner->magic == HEAP_MAGIC)
    report(call, p, h, "block allocated by heap");
  if (h->tag == TAG_FREED) report(call, p, NULL, "block already freed (double free, or freed by another heap)");
  report(call, p, NULL, "not a block of any checked heap (allocated before the checker, by mmap, or a bad pointer)");
}

static void *tag(void *raw, void *user, size_t size) {
  hdr *h = header_of(user);
  h->tag = TAG_LIVE ^ (uintptr_t)&g_heap;
  h->owner = &g_heap;
  h->size = size;
  h->raw = raw;
  return user;
}

static void *aligned(size_t align, size_t size) {
  if (align <= 16) align = 16;
  if (align & (align - 1)) return NULL;
  if (size > SIZE_MAX - align - sizeof(hdr)) return NULL;
  char *raw = __libc_malloc(size + align + sizeof(hdr));
  if (!raw) return NULL;
  uintptr_t u = ((uintptr_t)raw + sizeof(hdr) + align - 1) & ~(uintptr_t)(align - 1);
  return tag(raw, (void *)u, size);
}

EXPORT void *malloc(size_t size) {
  if (size > SIZE_MAX - sizeof(hdr)) return errno = ENOMEM, NULL;
  char *raw = __libc_malloc(size + sizeof(hdr));
  return raw ? tag(raw, raw + sizeof(hdr), size) : NULL;
}

EXPORT void free(void *p) {
  if (!p) return;
  hdr *h = own("free", p);
  h->tag = TAG_FREED;
  __libc_free(h->raw);
}

EXPORT void *calloc(size_t n, size_t size) {
  size_t b;
  if (__builtin_mul_overflow(n, size, &b) || b > SIZE_MAX - sizeof(hdr)) return errno = ENOMEM, NULL;
  char *raw = __libc_calloc(1, b + sizeof(hdr));
  return raw ? tag(raw, raw + sizeof(hdr), b) : NULL;
}

EXPORT void *realloc(void *p, size_t size) {
  if (!p) return malloc(size);
  if (size == 0) {
    free(p);
    return NULL;
  }
  hdr *h = own("realloc", p);
  if (size > SIZE_MAX - sizeof(hdr)) return errno = ENOMEM, NULL;
  if ((char *)h->raw + sizeof(hdr) == (char *)p) { /* plain block: the libc may grow it in place */
    char *raw = __libc_realloc(h->raw, size + sizeof(hdr));
    return raw ? tag(raw, raw + sizeof(hdr), size) : NULL;
  }
  void *q = malloc(size); /* an aligned block: realloc gives no alignment promise past 16 */
  if (!q) return NULL;
  memcpy(q, p, h->size < size ? h->size : size);
  free(p);
  return q;
}

EXPORT void *reallocarray(void *p, size_t n, size_t size) {
  size_t b;
  if (__builtin_mul_overflow(n, size, &b)) return errno = ENOMEM, NULL;
  return realloc(p, b);
}

EXPORT int posix_memalign(void **out, size_t align, size_t size) {
  if (align % sizeof(void *) || (align & (align - 1))) return EINVAL;
  void *p = aligned(align, size);
  if (!p) return ENOMEM;
  *out = p;
  return 0;
}

EXPORT void *aligned_alloc(size_t align, size_t size) {
  void *p = aligned(align, size);
  if (!p) errno = (align & (align - 1)) ? EINVAL : ENOMEM;
  return p;
}

EXPORT void *memalign(size_t align, size_t size) { return aligned_alloc(align, size); }

EXPORT void *valloc(size_t size) { return aligned((size_t)sysconf(_SC_PAGESIZE), size); }

EXPORT void *pvalloc(size_t size) {
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (size > SIZE_MAX - page) return errno = ENOMEM, NULL;
  return aligned(page, (size + page - 1) & ~(page - 1));
}

EXPORT size_t malloc_usable_size(void *p) { return p ? own("malloc_usable_size", p)->size : 0; }

EXPORT void servd_heap_check_set_name(const char *name) {
  size_t n = strlen(name);
  if (n >= sizeof g_heap.name) n = sizeof g_heap.name - 1;
  memcpy(g_heap.name, name, n);
  g_heap.name[n] = 0;
}

EXPORT const char *servd_heap_check_owner(const void *p) {
  const hdr *h = header_of(p);
  if (h->tag == (TAG_LIVE ^ (uintptr_t)h->owner) && h->owner && h->owner->magic == HEAP_MAGIC)
    return heap_name(h->owner);
  return "";
}

/* The main program's copy comes first in the process (LD_PRELOAD) and names itself; a namespace's
 * copy is named by the host right after it is loaded. */
__attribute__((constructor)) static void init(void) {
  if (!g_heap.name[0]) {
    g_len = 0;
    put("namespace heap @");
    put_hex((uintptr_t)&g_heap);
    g_buf[g_len] = 0;
    servd_heap_check_set_name(g_buf);
  }
}
