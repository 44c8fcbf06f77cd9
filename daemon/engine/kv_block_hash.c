/* llm-d's block hashes: see kv_block_hash.h. */
#include "engine/kv_block_hash.h"

#include <openssl/sha.h>
#include <stdlib.h>

/* A CBOR head: major type (0 unsigned, 3 text, 4 array) and its argument, shortest form. */
static size_t head(uint8_t *p, int major, uint64_t v) {
  uint8_t m = (uint8_t)(major << 5);
  if (v < 24) {
    p[0] = m | (uint8_t)v;
    return 1;
  }
  int bytes = v <= 0xff ? 1 : v <= 0xffff ? 2 : v <= 0xffffffffu ? 4 : 8;
  p[0] = m | (uint8_t)(bytes == 1 ? 24 : bytes == 2 ? 25 : bytes == 4 ? 26 : 27);
  for (int i = 0; i < bytes; i++) p[1 + i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
  return 1 + (size_t)bytes;
}

static uint64_t last8(const uint8_t *buf, size_t len) {
  uint8_t d[SHA256_DIGEST_LENGTH];
  SHA256(buf, len, d);
  uint64_t h = 0;
  for (int i = 24; i < 32; i++) h = h << 8 | d[i];
  return h;
}

uint64_t kv_block_hash_root(const char *seed) {
  if (!seed) seed = "";
  size_t n = 0;
  while (seed[n]) n++;
  uint8_t small[256], *buf = n + 9 <= sizeof small ? small : malloc(n + 9);
  if (!buf) return 0;
  size_t len = head(buf, 3, n);
  for (size_t i = 0; i < n; i++) buf[len++] = (uint8_t)seed[i];
  uint64_t h = last8(buf, len);
  if (buf != small) free(buf);
  return h;
}

uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n) {
  /* 1 (array of 3) + 9 (parent) + 9 (array of n) + 5 per token + 1 (null) */
  uint8_t small[1 + 9 + 9 + 5 * 64 + 1];
  size_t cap = 20 + 5 * (size_t)n;
  uint8_t *buf = cap <= sizeof small ? small : malloc(cap);
  if (!buf) return 0;
  size_t len = head(buf, 4, 3);
  len += head(buf + len, 0, parent);
  len += head(buf + len, 4, (uint64_t)n);
  for (int i = 0; i < n; i++) len += head(buf + len, 0, (uint32_t)tokens[i]);
  buf[len++] = 0xf6; /* null: no extra keys (no adapter, no multimodal input) */
  uint64_t h = last8(buf, len);
  if (buf != small) free(buf);
  return h;
}
