#include "http/arena.h"

#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct block {
  struct block *next;
  size_t cap, used;
  _Alignas(16) unsigned char data[];
} block;

typedef struct cleanup {
  struct cleanup *next;
  void (*fn)(void *);
  void *p;
} cleanup;

struct servd_arena {
  block *head; /* current block; the first one allocated stays across resets */
  block *first;
  size_t block_size;
  cleanup *cleanups;
};

static block *block_new(size_t cap) {
  block *b = malloc(sizeof(block) + cap);
  if (!b) return NULL;
  b->next = NULL;
  b->cap = cap;
  b->used = 0;
  return b;
}

servd_arena *servd_arena_create(size_t block_size) {
  servd_arena *a = calloc(1, sizeof(*a));
  if (!a) return NULL;
  a->block_size = block_size < 256 ? 256 : block_size;
  a->first = a->head = block_new(a->block_size);
  if (!a->first) {
    free(a);
    return NULL;
  }
  return a;
}

static void run_cleanups(servd_arena *a) {
  while (a->cleanups) {
    cleanup *c = a->cleanups;
    a->cleanups = c->next;
    c->fn(c->p); /* the node lives in the arena: freed with its block below */
  }
}

void servd_arena_reset(servd_arena *a) {
  if (!a) return;
  run_cleanups(a);
  block *b = a->head;
  while (b && b != a->first) {
    block *next = b->next;
    free(b);
    b = next;
  }
  a->head = a->first;
  a->first->used = 0;
}

void servd_arena_destroy(servd_arena *a) {
  if (!a) return;
  servd_arena_reset(a);
  free(a->first);
  free(a);
}

void *servd_arena_alloc(servd_arena *a, size_t n) {
  n = (n + 15) & ~(size_t)15;
  if (n == 0) n = 16;
  if (a->head->cap - a->head->used < n) {
    /* Large allocations get a block of their own size; blocks chain newest first. */
    size_t cap = n > a->block_size ? n : a->block_size;
    block *b = block_new(cap);
    if (!b) return NULL;
    b->next = a->head;
    a->head = b;
  }
  void *p = a->head->data + a->head->used;
  a->head->used += n;
  return p;
}

void *servd_arena_calloc(servd_arena *a, size_t n) {
  void *p = servd_arena_alloc(a, n);
  if (p) memset(p, 0, n);
  return p;
}

char *servd_arena_strndup(servd_arena *a, const char *s, size_t n) {
  char *d = servd_arena_alloc(a, n + 1);
  if (!d) return NULL;
  memcpy(d, s, n);
  d[n] = '\0';
  return d;
}

char *servd_arena_strdup(servd_arena *a, const char *s) { return servd_arena_strndup(a, s, strlen(s)); }

char *servd_arena_printf(servd_arena *a, const char *fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  int n = vsnprintf(NULL, 0, fmt, ap);
  va_end(ap);
  if (n < 0) return NULL;
  char *d = servd_arena_alloc(a, (size_t)n + 1);
  if (!d) return NULL;
  va_start(ap, fmt);
  vsnprintf(d, (size_t)n + 1, fmt, ap);
  va_end(ap);
  return d;
}

int servd_arena_cleanup_add(servd_arena *a, void (*fn)(void *), void *p) {
  cleanup *c = servd_arena_alloc(a, sizeof(*c));
  if (!c) return -1;
  c->fn = fn;
  c->p = p;
  c->next = a->cleanups;
  a->cleanups = c;
  return 0;
}
