/* Block hashes as llm-d's KV-cache indexer computes them from token ids (llm-d-kv-cache-manager,
 * kvblock.ChunkedTokenDatabase; vLLM's sha256_cbor with PYTHONHASHSEED set), so that a hash published
 * in a BlockStored event names the same block the indexer derives from a prompt's tokens:
 *
 *   root           = H(cbor(seed))                    seed: a text string ("" by default)
 *   hash(block i)  = H(cbor([parent, [t0, .., tn-1], null]))   parent: block i-1's hash, or root
 *   H(bytes)       = the last 8 bytes of SHA-256(bytes), read big-endian
 *
 * cbor() is canonical CBOR (RFC 8949 4.2.1: the shortest head for every integer and length).
 * These hashes are only names for the outside world: servd's own prefix cache finds blocks by its
 * faster hash and compares their content (prefix_cache.h). */
#ifndef SERVD_ENGINE_KV_BLOCK_HASH_H
#define SERVD_ENGINE_KV_BLOCK_HASH_H

#include <stddef.h>
#include <stdint.h>

/* The root parent hash of a seed (NUL-terminated; NULL is ""). */
uint64_t kv_block_hash_root(const char *seed);
/* The hash of a full block of n tokens after the block hashed parent. */
uint64_t kv_block_hash(uint64_t parent, const int32_t *tokens, int n);

#endif
