/* The block file format: see prefix_disk_format.h. */
#include "engine/prefix_disk_format.h"

#include <string.h>
#include <zlib.h>

static const char magic[8] = {'S', 'V', 'K', 'V', 'B', 'L', 'K', '1'};

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 3; i >= 0; i--) v = v << 8 | p[i];
  return v;
}
static uint64_t get64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = v << 8 | p[i];
  return v;
}

/* zlib's crc32 takes lengths in uInt: feed large payloads in pieces. */
static uint32_t crc_of(const void *data, uint64_t n) {
  uLong c = crc32(0L, Z_NULL, 0);
  const Bytef *p = data;
  while (n > 0) {
    uInt k = n > (1u << 30) ? (1u << 30) : (uInt)n;
    c = crc32(c, p, k);
    p += k;
    n -= k;
  }
  return (uint32_t)c;
}

size_t prefix_disk_header_bytes(uint32_t block_size) { return PREFIX_DISK_FIXED + 4 * (size_t)block_size; }

void prefix_disk_header_write(uint8_t *out, const prefix_disk_meta *m, const int32_t *tokens, const void *payload) {
  memcpy(out, magic, 8);
  put32(out + 8, PREFIX_DISK_VERSION);
  put32(out + 12, (uint32_t)prefix_disk_header_bytes(m->block_size));
  put64(out + 16, m->model_key);
  put64(out + 24, m->hash);
  put64(out + 32, m->parent_hash);
  put32(out + 40, m->dtype);
  put32(out + 44, m->block_size);
  put32(out + 48, m->n_layers);
  put32(out + 52, m->n_kv_heads);
  put32(out + 56, m->head_dim);
  put32(out + 60, m->tp);
  put64(out + 64, m->payload_bytes);
  put32(out + 72, crc_of(payload, m->payload_bytes));
  put32(out + 76, 0);
  for (uint32_t i = 0; i < m->block_size; i++) put32(out + PREFIX_DISK_FIXED + 4 * (size_t)i, (uint32_t)tokens[i]);
}

static prefix_disk_verdict fail(const char **why, const char *what, prefix_disk_verdict v) {
  if (why) *why = what;
  return v;
}

prefix_disk_verdict prefix_disk_check(const uint8_t *buf, size_t len, const prefix_disk_meta *want,
                                      const int32_t *tokens, const uint8_t **payload, const char **why) {
  *payload = NULL;
  if (len < 16 || memcmp(buf, magic, 8) != 0) return fail(why, "not a block file (magic)", PREFIX_DISK_FOREIGN);
  if (get32(buf + 8) != PREFIX_DISK_VERSION) return fail(why, "another format version", PREFIX_DISK_FOREIGN);
  size_t hdr = prefix_disk_header_bytes(want->block_size);
  if (get32(buf + 12) != hdr) return fail(why, "another header size (block size)", PREFIX_DISK_FOREIGN);
  if (len < hdr) return fail(why, "shorter than its header", PREFIX_DISK_TRUNCATED);
  if (get64(buf + 16) != want->model_key) return fail(why, "another model, dtype or geometry", PREFIX_DISK_FOREIGN);
  if (get32(buf + 40) != want->dtype || get32(buf + 44) != want->block_size || get32(buf + 48) != want->n_layers ||
      get32(buf + 52) != want->n_kv_heads || get32(buf + 56) != want->head_dim || get32(buf + 60) != want->tp)
    return fail(why, "another dtype or cache geometry", PREFIX_DISK_FOREIGN);
  if (get64(buf + 64) != want->payload_bytes) return fail(why, "another payload size", PREFIX_DISK_FOREIGN);
  if (len - hdr != want->payload_bytes)
    return fail(why, len - hdr < want->payload_bytes ? "payload cut short" : "bytes past the payload",
                PREFIX_DISK_TRUNCATED);
  if (get64(buf + 24) != want->hash || get64(buf + 32) != want->parent_hash)
    return fail(why, "another block's chain hash", PREFIX_DISK_CORRUPT);
  for (uint32_t i = 0; i < want->block_size; i++)
    if ((int32_t)get32(buf + PREFIX_DISK_FIXED + 4 * (size_t)i) != tokens[i])
      return fail(why, "another block's tokens", PREFIX_DISK_CORRUPT);
  if (get32(buf + 72) != crc_of(buf + hdr, want->payload_bytes))
    return fail(why, "payload CRC mismatch", PREFIX_DISK_CORRUPT);
  *payload = buf + hdr;
  if (why) *why = NULL;
  return PREFIX_DISK_OK;
}
