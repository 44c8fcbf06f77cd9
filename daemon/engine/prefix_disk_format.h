/* One full KV block on disk (the prefix cache's disk tier, prefix_disk.h). Internal to the engine.
 *
 * A file is a header then the block's K/V bytes exactly as servd_kv_cache_block_read gives them,
 * rank after rank. All integers little-endian:
 *
 *   off  size  field
 *     0     8  magic "SVKVBLK1"
 *     8     4  version (1)
 *    12     4  header bytes (PREFIX_DISK_FIXED + 4 * block_size)
 *    16     8  model key: the package's content, the dtype and the cache geometry (prefix_disk_key)
 *    24     8  chain hash of this block (of its tokens and every block before it)
 *    32     8  chain hash of the block before it (0 for the first)
 *    40     4  dtype (servd_dtype value)
 *    44     4  block_size        48  n_layers        52  n_kv_heads (all ranks)
 *    56     4  head_dim          60  tensor-parallel ranks
 *    64     8  payload bytes
 *    72     4  CRC-32 (zlib) of the payload
 *    76     4  reserved, 0
 *    80  4*bs  the block's token ids (int32)
 *
 * A reader trusts nothing: every field must equal what it expects (a file of another model, dtype
 * or geometry is foreign), the length must be exactly header + payload (a short file is truncated),
 * the tokens must be the prompt's and the CRC the payload's (anything else is corrupt). */
#ifndef SERVD_ENGINE_PREFIX_DISK_FORMAT_H
#define SERVD_ENGINE_PREFIX_DISK_FORMAT_H

#include <stddef.h>
#include <stdint.h>

#define PREFIX_DISK_FIXED 80
#define PREFIX_DISK_VERSION 1

/* What a block file must say, and the block's own identity. */
typedef struct prefix_disk_meta {
  uint64_t model_key, hash, parent_hash;
  uint32_t dtype, block_size, n_layers, n_kv_heads, head_dim, tp;
  uint64_t payload_bytes;
} prefix_disk_meta;

typedef enum {
  PREFIX_DISK_OK = 0,
  PREFIX_DISK_FOREIGN,   /* not ours: another magic, version, model, dtype or geometry */
  PREFIX_DISK_TRUNCATED, /* shorter (or longer) than its header says */
  PREFIX_DISK_CORRUPT,   /* ours, whole, but another block's tokens or a payload that fails its CRC */
} prefix_disk_verdict;

/* Header bytes for a block of block_size tokens. */
size_t prefix_disk_header_bytes(uint32_t block_size);
/* Writes the header of m with tokens (m->block_size of them) and the payload's CRC into out
 * (prefix_disk_header_bytes(m->block_size) bytes). */
void prefix_disk_header_write(uint8_t *out, const prefix_disk_meta *m, const int32_t *tokens, const void *payload);
/* Checks a whole file buf[0, len) against want and tokens (want->block_size of them); on OK,
 * *payload points into buf at want->payload_bytes bytes. *why (may be NULL) says what failed. */
prefix_disk_verdict prefix_disk_check(const uint8_t *buf, size_t len, const prefix_disk_meta *want,
                                      const int32_t *tokens, const uint8_t **payload, const char **why);

#endif
