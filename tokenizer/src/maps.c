/* Growable buffers and the hash maps the tokenizer uses (string -> id, pair -> merge). */
#include <stdlib.h>
#include <string.h>

#include "tokenizer-impl.h"

int tok_buf_reserve(tok_buf *b, size_t extra) {
  if (b->len + extra <= b->cap) return 0;
  size_t cap = b->cap ? b->cap : 64;
  while (cap < b->len + extra) cap *= 2;
  char *p = realloc(b->p, cap);
  if (!p) return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory growing a buffer to %zu bytes", cap);
  b->p = p;
  b->cap = cap;
  return 0;
}

int tok_buf_append(tok_buf *b, const void *s, size_t n) {
  int rc = tok_buf_reserve(b, n + 1);
  if (rc) return rc;
  if (n) memcpy(b->p + b->len, s, n);
  b->len += n;
  return 0;
}

/* wyhash-style mixing: fast for short keys, good enough spread for open addressing. */
static inline uint64_t mix(uint64_t a, uint64_t b) {
  __uint128_t r = (__uint128_t)a * b;
  return (uint64_t)r ^ (uint64_t)(r >> 64);
}

uint64_t str_map_hash(const void *s, size_t n) {
  const uint8_t *p = s;
  uint64_t h = 0x9E3779B97F4A7C15ull ^ n;
  while (n >= 8) {
    uint64_t w;
    memcpy(&w, p, 8);
    h = mix(h ^ w, 0xA0761D6478BD642Full);
    p += 8;
    n -= 8;
  }
  uint64_t w = 0;
  if (n) memcpy(&w, p, n);
  h = mix(h ^ w ^ ((uint64_t)n << 56), 0xE7037ED1A0B428DBull);
  return h | 1; /* never 0: 0 marks an empty slot */
}

static size_t pow2_at_least(size_t n) {
  size_t c = 16;
  while (c < n) c *= 2;
  return c;
}

int str_map_init(str_map *m, size_t expected) {
  memset(m, 0, sizeof *m);
  m->cap = pow2_at_least(expected * 2);
  m->hash = calloc(m->cap, sizeof *m->hash);
  m->off = malloc(m->cap * sizeof *m->off);
  m->klen = malloc(m->cap * sizeof *m->klen);
  m->val = malloc(m->cap * sizeof *m->val);
  if (!m->hash || !m->off || !m->klen || !m->val) {
    str_map_free(m);
    return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory for a map of %zu entries", expected);
  }
  return 0;
}

void str_map_free(str_map *m) {
  free(m->hash);
  free(m->off);
  free(m->klen);
  free(m->val);
  free(m->pool.p);
  memset(m, 0, sizeof *m);
}

static int str_map_grow(str_map *m) {
  str_map n = {0};
  n.cap = m->cap * 2;
  n.hash = calloc(n.cap, sizeof *n.hash);
  n.off = malloc(n.cap * sizeof *n.off);
  n.klen = malloc(n.cap * sizeof *n.klen);
  n.val = malloc(n.cap * sizeof *n.val);
  if (!n.hash || !n.off || !n.klen || !n.val) {
    free(n.hash), free(n.off), free(n.klen), free(n.val);
    return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory growing a map");
  }
  for (size_t i = 0; i < m->cap; i++) {
    if (!m->hash[i]) continue;
    size_t j = m->hash[i] & (n.cap - 1);
    while (n.hash[j]) j = (j + 1) & (n.cap - 1);
    n.hash[j] = m->hash[i];
    n.off[j] = m->off[i];
    n.klen[j] = m->klen[i];
    n.val[j] = m->val[i];
  }
  free(m->hash), free(m->off), free(m->klen), free(m->val);
  m->hash = n.hash, m->off = n.off, m->klen = n.klen, m->val = n.val, m->cap = n.cap;
  return 0;
}

int str_map_put(str_map *m, const void *key, size_t n, int32_t val) {
  if (n > UINT32_MAX || m->pool.len + n > UINT32_MAX)
    return servd_fail(SERVD_ERANGE, "tokenizer: map key of %zu bytes too large", n);
  uint64_t h = str_map_hash(key, n);
  size_t j = h & (m->cap - 1);
  while (m->hash[j]) {
    if (m->hash[j] == h && m->klen[j] == n && memcmp(m->pool.p + m->off[j], key, n) == 0) {
      m->val[j] = val;
      return 0;
    }
    j = (j + 1) & (m->cap - 1);
  }
  int rc = tok_buf_append(&m->pool, key, n);
  if (rc) return rc;
  m->hash[j] = h;
  m->off[j] = (uint32_t)(m->pool.len - n);
  m->klen[j] = (uint32_t)n;
  m->val[j] = val;
  if (++m->count * 2 > m->cap) return str_map_grow(m);
  return 0;
}

int32_t str_map_get(const str_map *m, const void *key, size_t n) {
  if (!m->cap) return -1;
  uint64_t h = str_map_hash(key, n);
  size_t j = h & (m->cap - 1);
  while (m->hash[j]) {
    if (m->hash[j] == h && m->klen[j] == n && memcmp(m->pool.p + m->off[j], key, n) == 0) return m->val[j];
    j = (j + 1) & (m->cap - 1);
  }
  return -1;
}

int merge_map_init(merge_map *m, size_t expected) {
  memset(m, 0, sizeof *m);
  m->cap = pow2_at_least(expected * 2);
  m->key = calloc(m->cap, sizeof *m->key);
  m->rank = malloc(m->cap * sizeof *m->rank);
  m->new_id = malloc(m->cap * sizeof *m->new_id);
  if (!m->key || !m->rank || !m->new_id) {
    merge_map_free(m);
    return servd_fail(SERVD_ENOMEM, "tokenizer: out of memory for %zu merges", expected);
  }
  return 0;
}

void merge_map_free(merge_map *m) {
  free(m->key);
  free(m->rank);
  free(m->new_id);
  memset(m, 0, sizeof *m);
}

int merge_map_put(merge_map *m, int32_t a, int32_t b, int32_t rank, int32_t new_id) {
  uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  if ((m->count + 1) * 2 > m->cap) {
    merge_map n;
    int rc = merge_map_init(&n, m->cap);
    if (rc) return rc;
    for (size_t i = 0; i < m->cap; i++) {
      if (!m->key[i]) continue;
      size_t j = pair_slot(m->key[i], n.cap);
      while (n.key[j]) j = (j + 1) & (n.cap - 1);
      n.key[j] = m->key[i], n.rank[j] = m->rank[i], n.new_id[j] = m->new_id[i];
    }
    n.count = m->count;
    merge_map_free(m);
    *m = n;
  }
  size_t j = pair_slot(k, m->cap);
  while (m->key[j] && m->key[j] != k) j = (j + 1) & (m->cap - 1);
  if (!m->key[j]) m->count++;
  m->key[j] = k;
  m->rank[j] = rank;
  m->new_id[j] = new_id;
  return 0;
}
