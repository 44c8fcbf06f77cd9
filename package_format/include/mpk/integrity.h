/* Integrity of model packages: the SHA-256 of entries against the manifest, and Ed25519 signatures
 * over the manifest (format: docs/package-format.md, "Integrity and signatures").
 *
 * The manifest records the SHA-256 of every other entry, so a signature over the exact manifest
 * bytes covers the whole package once the hashes are checked. The signature is the entry
 * "signature.ed25519": the 64-byte Ed25519 signature (RFC 8032) of manifest.json's bytes.
 *
 * Keys are PEM files as `openssl genpkey -algorithm ed25519` writes them (private) and
 * `openssl pkey -pubout` (public).
 */
#ifndef MPK_INTEGRITY_H
#define MPK_INTEGRITY_H

#include <stdbool.h>
#include <stddef.h>

#include "mpk/package.h"
#include "servd/status.h"

#define MPK_SIGNATURE_ENTRY "signature.ed25519"
#define MPK_SIGNATURE_BYTES 64

/* What mpk_verify_entries hashes. SMALL: every entry outside "weights/" (code, tokenizer, JSON):
 * the entries that are read whole at load, so checking them costs little. WEIGHTS: the
 * "weights/" entries (reads every byte of the model). The CRC-32 of each entry is checked too. */
enum { MPK_VERIFY_SMALL = 1, MPK_VERIFY_WEIGHTS = 2, MPK_VERIFY_ALL = 3 };

/* Recomputes the SHA-256 of the entries in `scope` (several threads for large entries) and checks
 * them against the manifest. On a mismatch returns SERVD_EFORMAT; the message names the entry. */
SERVD_API int mpk_verify_entries(mpk_package *p, unsigned scope);

/* A set of Ed25519 public keys. */
typedef struct mpk_keyring mpk_keyring;

/* Loads public keys from `path`: one PEM file, or a folder whose "*.pem" files are each one public
 * key (other files are ignored; a folder without any is an error, as is a file that is not an
 * Ed25519 public key). *out owned by the caller (mpk_keyring_free). */
SERVD_API int mpk_keyring_load(const char *path, mpk_keyring **out);
SERVD_API void mpk_keyring_free(mpk_keyring *k); /* accepts NULL */
SERVD_API int mpk_keyring_count(const mpk_keyring *k);

/* Checks the package's signature entry against the keys. 0 when one key verifies it (*signer, if
 * not NULL, is that key's file name, borrowed from the keyring); SERVD_EFORMAT when the package is
 * unsigned, the entry is malformed or no key verifies it (the message says which). */
SERVD_API int mpk_signature_check(mpk_package *p, const mpk_keyring *keys, const char **signer);

/* Signs the package at `path` with the Ed25519 private key in the PEM file `key_path` and writes
 * it to `out_path` (may equal `path`) with the signature entry added after the other entries,
 * replacing a signature already there. The package is validated and every hash checked first.
 * Written to a temporary file and renamed into place. */
SERVD_API int mpk_sign(const char *path, const char *key_path, const char *out_path);

/* What servd checks when it opens a package to serve it. */
typedef struct mpk_load_checks {
  bool verify_weights;      /* hash the weights too (reads the whole model) */
  const char *trusted_keys; /* NULL, or a key file or folder (mpk_keyring_load): only packages
                             * signed by one of these keys load */
} mpk_load_checks;

/* The signature (when trusted_keys is set), then the hashes of the small entries, then (when asked)
 * of the weights. `report` (may be NULL) receives one line on what was checked, e.g.
 * "signed by ops.pem; 12 entries hashed (1.4 MB) in 2 ms". */
SERVD_API int mpk_load_check(mpk_package *p, const mpk_load_checks *c, char *report, size_t report_len);

#endif
