/* Paged KV cache: block pools per layer (layout in ops-impl.h), a thread-safe free list, kv_write. */
#include "ops-impl.h"

#include <stdlib.h>
#include <sys/mman.h>

#include "servd/threadpool.h"

static size_t round64(size_t n) { return (n + 63) & ~(size_t)63; }

/* The block allocator: a stack of free ids (low ids handed out first) and per-block reference
 * counts. A block is shared by every holder of a reference (sequences with a common prefix, the
 * engine's prefix cache) and returns to the stack when the last one lets go. */
static int init_free_list(servd_kv_cache *c) {
  c->free_ids = malloc((size_t)c->n_blocks * sizeof *c->free_ids);
  c->refs = calloc((size_t)c->n_blocks, sizeof *c->refs);
  if (!c->free_ids || !c->refs) return SERVD_ENOMEM;
  for (int i = 0; i < c->n_blocks; i++) c->free_ids[i] = c->n_blocks - 1 - i;
  c->n_free = c->n_blocks;
  return pthread_mutex_init(&c->mu, NULL) != 0 ? SERVD_ENOMEM : 0; /* last: nothing to undo after it */
}

bool servd_kv_cache_dtype_ok(servd_dtype t) {
  return t == SERVD_F32 || t == SERVD_F16 || t == SERVD_BF16 || t == SERVD_Q8_0 || t == SERVD_Q4_0;
}

/* Bytes of one run (block_size tokens of one kv head, K or V, the larger), before rounding. */
static unsigned __int128 run_bytes(int head_dim, int block_size, servd_dtype dtype) {
  unsigned __int128 bs = (unsigned __int128)block_size, hd = (unsigned __int128)head_dim;
  if (!ops__kv_quantized(dtype)) return bs * hd * servd_dtype_block_bytes(dtype);
  unsigned __int128 k = ops__kvq_scale_bytes(head_dim, block_size) + hd * ops__kvq_krow(dtype, block_size);
  unsigned __int128 v = bs * (hd / 32) * servd_dtype_block_bytes(dtype);
  return k > v ? k : v;
}

size_t servd_kv_cache_block_bytes(int n_layers, int n_kv_heads, int head_dim, int block_size, servd_dtype dtype) {
  if (n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || block_size < 1 || !servd_kv_cache_dtype_ok(dtype) ||
      (ops__kv_quantized(dtype) && head_dim % 32 != 0) || head_dim > (1 << 20) || block_size > (1 << 20))
    return 0;
  return round64((size_t)run_bytes(head_dim, block_size, dtype)) * 2 * (size_t)n_kv_heads * (size_t)n_layers;
}

servd_dtype servd_kv_cache_dtype(const servd_kv_cache *c) { return c ? c->dtype : SERVD_F16; }

int servd_kv_cache_create(servd_kv_cache **out, int n_layers, int n_kv_heads, int head_dim, int block_size,
                          int n_blocks, servd_dtype dtype) {
  servd_kv_cache *c = NULL;
  if (!out || n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || block_size < 1 || n_blocks < 1 ||
      !servd_kv_cache_dtype_ok(dtype))
    return servd_fail(SERVD_EINVAL,
                      "kv_cache_create: expected positive n_layers, n_kv_heads, head_dim, block_size, n_blocks "
                      "and dtype f32, f16, bf16, q8_0 or q4_0; got %d, %d, %d, %d, %d, %s",
                      n_layers, n_kv_heads, head_dim, block_size, n_blocks, servd_dtype_name(dtype));
  if (ops__kv_quantized(dtype) && head_dim % 32 != 0)
    return servd_fail(SERVD_EINVAL,
                      "kv_cache_create: a %s cache quantizes blocks of 32 dims, so head_dim must be a multiple of 32; "
                      "got head_dim %d (use f16 or bf16)",
                      servd_dtype_name(dtype), head_dim);
  *out = NULL;
  size_t elem = ops__kv_quantized(dtype) ? 0 : servd_dtype_block_bytes(dtype);
  /* every size below stays far from SIZE_MAX: check the product in 128 bits */
  unsigned __int128 head = run_bytes(head_dim, block_size, dtype);
  unsigned __int128 total =
      (head + 64) * (unsigned __int128)n_kv_heads * (unsigned __int128)n_blocks * 2u * (unsigned __int128)n_layers;
  if (total > ((unsigned __int128)1 << 46)) /* 64 TiB: surely a wrong argument */
    return servd_fail(SERVD_ERANGE,
                      "kv_cache_create: %d layers x %d blocks x %d tokens x %d heads x %d dims of %s is too large",
                      n_layers, n_blocks, block_size, n_kv_heads, head_dim, servd_dtype_name(dtype));
  c = calloc(1, sizeof *c);
  if (!c) goto fail;
  c->n_layers = n_layers;
  c->n_kv_heads = n_kv_heads;
  c->head_dim = head_dim;
  c->block_size = block_size;
  c->n_blocks = n_blocks;
  c->dtype = dtype;
  c->elem = elem;
  c->head_bytes = round64((size_t)head);
  c->pool_bytes = c->head_bytes * (size_t)n_kv_heads * (size_t)n_blocks * 2 * (size_t)n_layers;
  /* an anonymous mapping: zeroed, page aligned, and only touched pages cost memory */
  c->pool = mmap(NULL, c->pool_bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (c->pool == MAP_FAILED) {
    c->pool = NULL;
    goto fail;
  }
  /* attention walks blocks in table order, i.e. at random: 2 MiB pages spare most TLB misses.
   * Advice only; without transparent huge pages it changes nothing. */
  (void)madvise(c->pool, c->pool_bytes, MADV_HUGEPAGE);
  if (init_free_list(c) != 0) goto fail;
  *out = c;
  return 0;
fail:
  if (c && c->pool) munmap(c->pool, c->pool_bytes);
  if (c) {
    free(c->free_ids);
    free(c->refs);
  }
  free(c);
  return servd_fail(SERVD_ENOMEM,
                    "kv_cache_create: out of memory for %d layers x %d blocks x %d tokens x %d heads x %d dims of %s",
                    n_layers, n_blocks, block_size, n_kv_heads, head_dim, servd_dtype_name(dtype));
}

int servd_kv_cache_create_blocks_only(servd_kv_cache **out, int n_layers, int n_kv_heads, int head_dim, int block_size,
                                      int n_blocks) {
  if (out) *out = NULL;
  if (!out || n_layers < 1 || n_kv_heads < 1 || head_dim < 1 || block_size < 1 || n_blocks < 1)
    return servd_fail(SERVD_EINVAL,
                      "kv_cache_create_blocks_only: expected positive n_layers, n_kv_heads, head_dim, block_size "
                      "and n_blocks; got %d, %d, %d, %d, %d",
                      n_layers, n_kv_heads, head_dim, block_size, n_blocks);
  *out = NULL;
  servd_kv_cache *c = calloc(1, sizeof *c);
  if (!c) goto fail;
  /* No storage: n_layers stays 0, so every layer index is out of range for the ops that would
   * touch K/V (attention reports it; kv_write names the reason). */
  c->n_kv_heads = n_kv_heads;
  c->head_dim = head_dim;
  c->block_size = block_size;
  c->n_blocks = n_blocks;
  c->dtype = SERVD_F16;
  c->elem = servd_dtype_block_bytes(SERVD_F16);
  if (init_free_list(c) != 0) goto fail;
  *out = c;
  return 0;
fail:
  if (c) {
    free(c->free_ids);
    free(c->refs);
  }
  free(c);
  return servd_fail(SERVD_ENOMEM, "kv_cache_create_blocks_only: out of memory for the free list of %d blocks",
                    n_blocks);
}

void servd_kv_cache_destroy(servd_kv_cache *c) {
  if (!c) return;
  pthread_mutex_destroy(&c->mu);
  if (c->pool) munmap(c->pool, c->pool_bytes);
  free(c->free_ids);
  free(c->refs);
  free(c);
}

int servd_kv_cache_block_size(const servd_kv_cache *c) { return c ? c->block_size : 0; }
int servd_kv_cache_n_blocks(const servd_kv_cache *c) { return c ? c->n_blocks : 0; }

int servd_kv_cache_free_blocks(const servd_kv_cache *c) {
  if (!c) return 0;
  servd_kv_cache *m = (servd_kv_cache *)c; /* the lock is not part of the logical state */
  pthread_mutex_lock(&m->mu);
  int n = m->n_free;
  pthread_mutex_unlock(&m->mu);
  return n;
}

int servd_kv_cache_alloc(servd_kv_cache *c, int n, int32_t *ids) {
  if (!c || n < 0 || (n > 0 && !ids))
    return servd_fail(SERVD_EINVAL, "kv_cache_alloc: expected a cache, n >= 0 and an ids array; got n %d", n);
  pthread_mutex_lock(&c->mu);
  if (n > c->n_free) {
    int have = c->n_free;
    pthread_mutex_unlock(&c->mu);
    return servd_fail(SERVD_EBUSY, "kv_cache_alloc: %d blocks asked, %d free of %d", n, have, c->n_blocks);
  }
  for (int i = 0; i < n; i++) {
    ids[i] = c->free_ids[--c->n_free];
    c->refs[ids[i]] = 1;
  }
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int servd_kv_cache_ref(servd_kv_cache *c, int n, const int32_t *ids) {
  if (!c || n < 0 || (n > 0 && !ids))
    return servd_fail(SERVD_EINVAL, "kv_cache_ref: expected a cache, n >= 0 and an ids array; got n %d", n);
  pthread_mutex_lock(&c->mu);
  for (int i = 0; i < n; i++) {
    int32_t b = ids[i];
    if (b < 0 || b >= c->n_blocks || c->refs[b] <= 0) {
      for (int k = 0; k < i; k++) c->refs[ids[k]]--; /* all or nothing */
      pthread_mutex_unlock(&c->mu);
      return servd_fail(SERVD_EINVAL, "kv_cache_ref: block %d is %s", b,
                        b < 0 || b >= c->n_blocks ? "out of range" : "free (only a held block can be shared)");
    }
    c->refs[b]++;
  }
  pthread_mutex_unlock(&c->mu);
  return 0;
}

int servd_kv_cache_refcount(const servd_kv_cache *c, int32_t id) {
  if (!c || id < 0 || id >= c->n_blocks) return 0;
  servd_kv_cache *m = (servd_kv_cache *)c; /* the lock is not part of the logical state */
  pthread_mutex_lock(&m->mu);
  int r = m->refs[id];
  pthread_mutex_unlock(&m->mu);
  return r;
}

void servd_kv_cache_free(servd_kv_cache *c, int n, const int32_t *ids) {
  if (!c || n <= 0 || !ids) return;
  pthread_mutex_lock(&c->mu);
  /* pushed last to first, so the next alloc of n hands them out in the order given: a sequence's
   * blocks stay in ascending ids, which attention then reads as one stream per kv head */
  for (int i = n - 1; i >= 0; i--) {
    int32_t b = ids[i];
    if (b < 0 || b >= c->n_blocks || c->refs[b] <= 0) continue; /* not ours to take back */
    if (--c->refs[b] == 0) c->free_ids[c->n_free++] = b;
  }
  pthread_mutex_unlock(&c->mu);
}

typedef struct write_job {
  const servd_kv_cache *c;
  int layer;
  ops__rows k, v;
  const char *slots;
  int64_t slot_stride;
} write_job;

static void write_task(void *ctx, int64_t begin, int64_t end, int thread) {
  (void)thread;
  const write_job *j = ctx;
  const servd_kv_cache *c = j->c;
  for (int64_t r = begin; r < end; r++) {
    int32_t slot = *(const int32_t *)(j->slots + r * j->slot_stride);
    int32_t blk = slot / c->block_size;
    int off = slot % c->block_size;
    const float *k = (const float *)(j->k.data + r * j->k.stride);
    const float *v = (const float *)(j->v.data + r * j->v.stride);
    int hd = c->head_dim;
    for (int g = 0; g < c->n_kv_heads; g++) {
      char *vdst = ops__kv_run(c, j->layer, 1, blk, g) + (size_t)off * (size_t)hd * c->elem;
      char *kdst = ops__kv_run(c, j->layer, 0, blk, g); /* K is [dim][token]: a strided column */
      const float *ks = k + (size_t)g * (size_t)hd, *vs = v + (size_t)g * (size_t)hd;
      if (c->dtype == SERVD_F32) {
        memcpy(vdst, vs, (size_t)hd * sizeof(float));
        for (int d = 0; d < hd; d++) ((float *)kdst)[(size_t)d * (size_t)c->block_size + (size_t)off] = ks[d];
      } else if (c->dtype == SERVD_F16 || c->dtype == SERVD_BF16) {
        bool h = c->dtype == SERVD_F16;
        servd_row_from_f32(c->dtype, vs, vdst, hd);
        for (int d = 0; d < hd; d++)
          ((uint16_t *)kdst)[(size_t)d * (size_t)c->block_size + (size_t)off] =
              h ? servd_f32_to_f16(ks[d]) : servd_f32_to_bf16(ks[d]);
      } else {
        ops__kvq_write(c, kdst, ops__kv_run(c, j->layer, 1, blk, g), off, ks, vs);
      }
    }
  }
}

int servd_kv_write(servd_kv_cache *c, int layer, const servd_tensor *k, const servd_tensor *v,
                   const servd_tensor *slots) {
  char bk[96], bv[96], bs[96];
  write_job j = {.c = c, .layer = layer};
  const char *why = NULL;
  int64_t width = c ? (int64_t)c->n_kv_heads * c->head_dim : 0;
  if (!c) {
    why = "cache is NULL";
  } else if (!c->pool) {
    why = "this cache keeps block bookkeeping only (its K/V live on a device): write through the device cache";
  } else if (layer < 0 || layer >= c->n_layers) {
    why = "layer out of range";
  } else if (!k || !v || k->dtype != SERVD_F32 || v->dtype != SERVD_F32 || k->ndim != 2 || v->ndim != 2 ||
             ops__as_rows(k, &j.k) != 0 || ops__as_rows(v, &j.v) != 0 || j.k.cols != width || j.v.cols != width ||
             j.k.rows != j.v.rows) {
    why = "k and v must be f32 (t, n_kv_heads*head_dim)";
  } else if (!slots || slots->dtype != SERVD_I32 || slots->ndim != 1 || slots->shape[0] != j.k.rows) {
    why = "slots must be i32 (t)";
  }
  if (!why) {
    j.slots = servd_tensor_data(slots);
    j.slot_stride = slots->strides[0];
    int64_t n_slots = (int64_t)c->n_blocks * c->block_size;
    for (int64_t r = 0; r < j.k.rows; r++) {
      int32_t s = *(const int32_t *)(j.slots + r * j.slot_stride);
      if (s < 0 || s >= n_slots) {
        return servd_fail(SERVD_EINVAL,
                          "kv_write: slots[%lld] = %d outside [0, %lld) (%d blocks of %d); k %s, v %s, slots %s",
                          (long long)r, s, (long long)n_slots, c->n_blocks, c->block_size, ops__desc(k, bk, sizeof bk),
                          ops__desc(v, bv, sizeof bv), ops__desc(slots, bs, sizeof bs));
      }
    }
  }
  if (why)
    return servd_fail(SERVD_EINVAL,
                      "kv_write: %s; got layer %d of %d, k %s, v %s, slots %s, cache %d kv heads x %d dims %s", why,
                      layer, c ? c->n_layers : 0, ops__desc(k, bk, sizeof bk), ops__desc(v, bv, sizeof bv),
                      ops__desc(slots, bs, sizeof bs), c ? c->n_kv_heads : 0, c ? c->head_dim : 0,
                      c ? servd_dtype_name(c->dtype) : "-");
  if (j.k.rows == 0) return 0;
  int64_t grain = width >= 4096 ? 4 : 16384 / width + 1;
  servd_parallel_for(j.k.rows, grain, write_task, &j);
  return 0;
}

/* A block's runs in [layer][kv head][K|V] order, head_bytes each. */
static int block_io(const servd_kv_cache *c, int32_t id, const char *what) {
  if (!c || !c->pool)
    return servd_fail(SERVD_EINVAL, "kv_cache_block_%s: %s", what,
                      c ? "this cache keeps block bookkeeping only (its K/V live on a device)" : "cache is NULL");
  if (id < 0 || id >= c->n_blocks)
    return servd_fail(SERVD_EINVAL, "kv_cache_block_%s: block %d outside [0, %d)", what, id, c->n_blocks);
  return 0;
}

int servd_kv_cache_block_read(const servd_kv_cache *c, int32_t id, void *dst) {
  int rc = block_io(c, id, "read");
  if (rc) return rc;
  char *o = dst;
  for (int l = 0; l < c->n_layers; l++)
    for (int g = 0; g < c->n_kv_heads; g++, o += 2 * c->head_bytes)
      memcpy(o, ops__kv_run(c, l, 0, id, g), 2 * c->head_bytes); /* K and V runs are adjacent */
  return 0;
}

int servd_kv_cache_block_write(servd_kv_cache *c, int32_t id, const void *src) {
  int rc = block_io(c, id, "write");
  if (rc) return rc;
  const char *p = src;
  for (int l = 0; l < c->n_layers; l++)
    for (int g = 0; g < c->n_kv_heads; g++, p += 2 * c->head_bytes)
      memcpy(ops__kv_run(c, l, 0, id, g), p, 2 * c->head_bytes);
  return 0;
}
