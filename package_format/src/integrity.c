/* Entry hashes against the manifest (the one hashing path of `modelpkg verify` and of servd's load
 * checks), and the checks servd runs when it opens a package to serve it.
 *
 * Entries are hashed by up to 8 threads, one entry at a time each: SHA-256 runs at about 1.5-2 GB/s
 * per core with the SHA extensions, so a 16 GB model takes seconds on one core and a fraction of
 * that spread over several. */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>
#include <zlib.h>

#include "mpk-impl.h"
#include "mpk/integrity.h"

#define MAX_HASH_THREADS 8
#define THREADED_BYTES ((uint64_t)64 << 20) /* below this, one thread: starting threads costs more */

enum { OK = 0, BAD_CRC = 1, BAD_SHA = 2 };

typedef struct hash_job {
  mpk_package *p;
  json_t *files;  /* manifest "files" */
  const int *idx; /* file indices to check */
  int n;
  int *result;     /* per job entry: OK, BAD_CRC, BAD_SHA */
  char (*hex)[65]; /* per job entry: the computed SHA-256 */
  atomic_int next;
} hash_job;

static bool is_weight(const char *path) { return strncmp(path, "weights/", 8) == 0; }

/* Entries whose hash is not in the manifest: the manifest itself and the signature over it. */
static bool unhashed(const char *path) { return !strcmp(path, "manifest.json") || !strcmp(path, MPK_SIGNATURE_ENTRY); }

static void check_one(hash_job *j, int k) {
  mpk_file_info fi;
  const void *data;
  size_t len;
  mpk_file_info_at(j->p, j->idx[k], &fi);
  mpk_file(j->p, fi.path, &data, &len);
  uLong crc = crc32(0, NULL, 0);
  for (size_t off = 0; off < len;) { /* crc32 takes 32-bit lengths */
    uInt n = (uInt)(len - off > (1u << 30) ? (1u << 30) : len - off);
    crc = crc32(crc, (const Bytef *)data + off, n);
    off += n;
  }
  j->result[k] = OK;
  if (crc != fi.crc32) {
    j->result[k] = BAD_CRC;
    return;
  }
  if (unhashed(fi.path)) return;
  mpk__sha256_hex(data, len, j->hex[k]);
  const char *want = json_string_value(json_object_get(json_object_get(j->files, fi.path), "sha256"));
  if (!want || strcmp(want, j->hex[k])) j->result[k] = BAD_SHA;
}

static void *hash_worker(void *arg) {
  hash_job *j = arg;
  for (int k; (k = atomic_fetch_add(&j->next, 1)) < j->n;) check_one(j, k);
  return NULL;
}

int mpk_verify_entries(mpk_package *p, unsigned scope) {
  int rc = 0, nf = mpk_file_count(p), n = 0;
  hash_job j = {.p = p, .files = json_object_get(mpk_manifest(p), "files")};
  int *idx = calloc(nf ? (size_t)nf : 1, sizeof *idx);
  int *result = calloc(nf ? (size_t)nf : 1, sizeof *result);
  char(*hex)[65] = calloc(nf ? (size_t)nf : 1, sizeof *hex);
  if (!idx || !result || !hex) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", mpk_path(p));
    goto done;
  }
  uint64_t bytes = 0;
  for (int i = 0; i < nf; i++) {
    mpk_file_info fi;
    mpk_file_info_at(p, i, &fi);
    if (!(scope & (is_weight(fi.path) ? MPK_VERIFY_WEIGHTS : MPK_VERIFY_SMALL))) continue;
    idx[n++] = i;
    bytes += fi.size;
  }
  j.idx = idx;
  j.n = n;
  j.result = result;
  j.hex = hex;
  atomic_init(&j.next, 0);
  long cpus = sysconf(_SC_NPROCESSORS_ONLN);
  int nt = bytes < THREADED_BYTES ? 1 : (int)(cpus < 1 ? 1 : cpus > MAX_HASH_THREADS ? MAX_HASH_THREADS : cpus);
  if (nt > n) nt = n > 0 ? n : 1;
  pthread_t th[MAX_HASH_THREADS];
  int started = 0;
  for (int t = 1; t < nt; t++, started++)
    if (pthread_create(&th[t - 1], NULL, hash_worker, &j)) break; /* fewer threads still finish the job */
  hash_worker(&j);
  for (int t = 0; t < started; t++) pthread_join(th[t], NULL);
  /* Report the first bad entry in archive order, whatever thread found it. */
  for (int k = 0; k < n; k++) {
    if (result[k] == OK) continue;
    const char *path = mpk_file_path(p, idx[k]);
    if (result[k] == BAD_CRC) {
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": CRC-32 mismatch (corrupt data)", mpk_path(p), path);
    } else {
      const char *want = json_string_value(json_object_get(json_object_get(j.files, path), "sha256"));
      rc = servd_fail(SERVD_EFORMAT, "%s: entry \"%s\": sha256 %s, manifest says %s (modified after packing)",
                      mpk_path(p), path, hex[k], want ? want : "(none)");
    }
    break;
  }
done:
  free(idx);
  free(result);
  free(hex);
  return rc;
}

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

int mpk_load_check(mpk_package *p, const mpk_load_checks *c, char *report, size_t report_len) {
  int rc = 0;
  mpk_keyring *keys = NULL;
  char signer[300] = "unsigned (no trusted keys configured)";
  double t0 = now_s();
  if (c->trusted_keys) {
    const char *who = NULL;
    if ((rc = mpk_keyring_load(c->trusted_keys, &keys))) goto done;
    if ((rc = mpk_signature_check(p, keys, &who))) goto done;
    snprintf(signer, sizeof signer, "signed by %s", who);
  }
  unsigned scope = MPK_VERIFY_SMALL | (c->verify_weights ? MPK_VERIFY_WEIGHTS : 0);
  if ((rc = mpk_verify_entries(p, scope))) goto done;
  uint64_t bytes = 0;
  int n = 0;
  for (int i = 0; i < mpk_file_count(p); i++) {
    mpk_file_info fi;
    mpk_file_info_at(p, i, &fi);
    if (!(scope & (is_weight(fi.path) ? MPK_VERIFY_WEIGHTS : MPK_VERIFY_SMALL))) continue;
    bytes += fi.size;
    n++;
  }
  if (report && report_len)
    snprintf(report, report_len, "%s; %d entries hashed (%.2f MB%s) in %.0f ms", signer, n, (double)bytes / 1e6,
             c->verify_weights ? ", weights included" : ", weights not checked", (now_s() - t0) * 1e3);
done:
  mpk_keyring_free(keys);
  return rc;
}
