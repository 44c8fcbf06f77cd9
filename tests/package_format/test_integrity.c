/* Package integrity: entry hashes checked by scope (code and small entries, weights), tampering
 * refused with the entry named (also when the attacker fixed the CRC-32), Ed25519 signing and
 * checking (round trip, wrong key, unsigned, manifest changed after signing, re-signing, zip64
 * packages), key files and folders, and the load checks servd runs. */
#include <stdarg.h>
#include <stddef.h>
#include <setjmp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <cmocka.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "mpk-impl.h"
#include "mpk/integrity.h"
#include "mpk/package.h"
#include "mpk/writer.h"

#define TEST_DIR_TEMPLATE "/tmp/mpk-integrity-XXXXXX"
#include "test-util.h"

static const char code[] = "def forward(batch):\n    return batch\n";

static void force64(mpk_writer *w) { mpk__writer_force_zip64(w); }

/* A small package: a code file, a tokenizer, one f32 tensor. */
static const char *write_pkg(const char *name, bool zip64) {
  static char path[512];
  snprintf(path, sizeof path, "%s/%s.mpk", dir, name);
  mpk_writer *w;
  assert_int_equal(mpk_writer_create(path, &w), 0);
  if (zip64) force64(w);
  assert_int_equal(mpk_writer_set(w, "name", json_string("t")), 0);
  assert_int_equal(mpk_writer_set(w, "model_version", json_string("1")), 0);
  assert_int_equal(mpk_writer_set(w, "kind", json_string("generic")), 0);
  assert_int_equal(mpk_writer_set(w, "entry_point", json_string("m.model:M")), 0);
  assert_int_equal(mpk_writer_set(w, "config", json_object()), 0);
  assert_int_equal(mpk_writer_add_file(w, "code/m/model.py", code, sizeof code - 1), 0);
  assert_int_equal(mpk_writer_add_file(w, "tokenizer.json", "{}", 2), 0);
  float x[64];
  for (int i = 0; i < 64; i++) x[i] = (float)i;
  int64_t s[1] = {64};
  assert_int_equal(mpk_writer_add_tensor(w, "w", SERVD_F32, 1, s, x, sizeof x), 0);
  assert_int_equal(mpk_writer_finish(w), 0);
  mpk_writer_destroy(w);
  return path;
}

/* The offset of an entry's data and where its CRC sits in the local and central headers. */
typedef struct where {
  uint64_t data, size, lcrc, ccrc;
} where;

static where locate(const char *path, const char *entry) {
  mpk_map m;
  mpk_zip z;
  assert_int_equal(mpk__map_file(path, &m), 0);
  assert_int_equal(mpk__zip_parse(path, m.data, m.len, &z), 0);
  int i = mpk__zip_find(&z, entry);
  assert_true(i >= 0);
  where w = {z.e[i].data, z.e[i].usize, z.e[i].lho + 14, 0};
  /* central record of entry i */
  const uint8_t *b = m.data;
  uint64_t p = z.cd_offset;
  for (int k = 0; k < i; k++) p += 46 + (uint64_t)rd16(b + p + 28) + rd16(b + p + 30) + rd16(b + p + 32);
  w.ccrc = p + 16;
  mpk__zip_free(&z);
  mpk__unmap(&m);
  return w;
}

/* Flips one byte of an entry; with fix_crc, rewrites the CRC-32 in both headers as a careful
 * attacker would, so that only the SHA-256 in the manifest can tell. */
static void tamper(const char *path, const char *entry, uint64_t at, bool fix_crc) {
  where w = locate(path, entry);
  char *b;
  size_t len;
  assert_int_equal(mpk__read_file(path, 1 << 30, &b, &len), 0);
  b[w.data + at] ^= 0x20;
  if (fix_crc) {
    uint32_t crc = (uint32_t)crc32(0, (const Bytef *)b + w.data, (uInt)w.size);
    wr32((uint8_t *)b + w.lcrc, crc);
    wr32((uint8_t *)b + w.ccrc, crc);
  }
  assert_int_equal(mpk__write_file(path, b, len), 0);
  free(b);
}

static int check_scope(const char *path, unsigned scope) {
  mpk_package *p;
  assert_int_equal(mpk_open(path, &p), 0); /* opening reads no data: tampering passes it */
  int rc = mpk_verify_entries(p, scope);
  mpk_close(p);
  return rc;
}

static void tampered_code_refused(void **state) {
  (void)state;
  for (int fix = 0; fix < 2; fix++) {
    const char *path = write_pkg("code", false);
    assert_int_equal(check_scope(path, MPK_VERIFY_ALL), 0);
    tamper(path, "code/m/model.py", 4, fix);
    assert_int_equal(check_scope(path, MPK_VERIFY_SMALL), SERVD_EFORMAT);
    assert_non_null(strstr(servd_last_error(), "entry \"code/m/model.py\""));
    assert_non_null(strstr(servd_last_error(), fix ? "sha256" : "CRC-32"));
    assert_int_equal(check_scope(path, MPK_VERIFY_WEIGHTS), 0); /* not in that scope */
  }
}

static void flipped_weight_refused(void **state) {
  (void)state;
  const char *path = write_pkg("weight", false);
  where w = locate(path, "weights/w.safetensors");
  tamper(path, "weights/w.safetensors", w.size - 3, true);
  assert_int_equal(check_scope(path, MPK_VERIFY_SMALL), 0);
  assert_int_equal(check_scope(path, MPK_VERIFY_WEIGHTS), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "weights/w.safetensors"));
  /* the load checks: weights only when asked */
  mpk_package *p;
  assert_int_equal(mpk_open(path, &p), 0);
  char rep[256];
  mpk_load_checks c = {.verify_weights = false};
  assert_int_equal(mpk_load_check(p, &c, rep, sizeof rep), 0);
  assert_non_null(strstr(rep, "weights not checked"));
  c.verify_weights = true;
  assert_int_equal(mpk_load_check(p, &c, rep, sizeof rep), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "weights/w.safetensors"));
  assert_int_equal(mpk_verify(p), SERVD_EFORMAT); /* modelpkg verify: the same path */
  mpk_close(p);
}

/* An Ed25519 key pair as PEM files <dir>/<name>.key (private) and <kdir>/<name>.pem (public). */
static void keygen(const char *name, const char *kdir) {
  EVP_PKEY *k = EVP_PKEY_Q_keygen(NULL, NULL, "ED25519");
  assert_non_null(k);
  char path[600];
  snprintf(path, sizeof path, "%s/%s.key", dir, name);
  FILE *f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(PEM_write_PrivateKey(f, k, NULL, NULL, 0, NULL, NULL), 1);
  fclose(f);
  snprintf(path, sizeof path, "%s/%s.pem", kdir, name);
  f = fopen(path, "w");
  assert_non_null(f);
  assert_int_equal(PEM_write_PUBKEY(f, k), 1);
  fclose(f);
  EVP_PKEY_free(k);
}

static int sig_check(const char *path, const char *keys, const char **signer_out) {
  mpk_keyring *r;
  assert_int_equal(mpk_keyring_load(keys, &r), 0);
  mpk_package *p;
  assert_int_equal(mpk_open(path, &p), 0);
  const char *signer = NULL;
  int rc = mpk_signature_check(p, r, &signer);
  static char name[128];
  snprintf(name, sizeof name, "%s", signer ? signer : "");
  if (signer_out) *signer_out = name;
  mpk_close(p);
  mpk_keyring_free(r);
  return rc;
}

static void sign_roundtrip(void **state) {
  (void)state;
  char trusted[400], other[400], priv[600], priv_b[600], pub_a[600], pub_b[600];
  snprintf(trusted, sizeof trusted, "%s/trusted", dir);
  snprintf(other, sizeof other, "%s/other", dir);
  mkdir(trusted, 0700);
  mkdir(other, 0700);
  keygen("a", trusted);
  keygen("z", trusted);
  keygen("b", other);
  snprintf(priv, sizeof priv, "%s/a.key", dir);
  snprintf(priv_b, sizeof priv_b, "%s/b.key", dir);
  snprintf(pub_a, sizeof pub_a, "%s/a.pem", trusted);
  snprintf(pub_b, sizeof pub_b, "%s/b.pem", other);
  for (int z64 = 0; z64 < 2; z64++) {
    const char *path = write_pkg(z64 ? "signed64" : "signed", z64);
    char *before;
    size_t blen;
    assert_int_equal(mpk__read_file(path, 1 << 30, &before, &blen), 0);
    assert_int_equal(sig_check(path, pub_a, NULL), SERVD_EFORMAT); /* unsigned */
    assert_non_null(strstr(servd_last_error(), "unsigned package"));

    assert_int_equal(mpk_sign(path, priv, path), 0);
    mpk_package *p;
    assert_int_equal(mpk_open(path, &p), 0); /* still a valid package; the entries are unchanged */
    assert_int_equal(mpk_verify(p), 0);
    const void *sig;
    size_t slen;
    assert_int_equal(mpk_file(p, MPK_SIGNATURE_ENTRY, &sig, &slen), 0);
    assert_int_equal(slen, MPK_SIGNATURE_BYTES);
    mpk_file_info fi;
    for (int i = 0; i < mpk_file_count(p); i++) {
      assert_int_equal(mpk_file_info_at(p, i, &fi), 0);
      assert_int_equal(fi.offset % SERVD_ALIGN, 0);
    }
    mpk_close(p);
    char *after;
    size_t alen;
    assert_int_equal(mpk__read_file(path, 1 << 30, &after, &alen), 0);
    where m = locate(path, "manifest.json");
    assert_memory_equal(before, after, m.data + m.size); /* every entry's bytes kept */
    free(before);

    const char *signer;
    assert_int_equal(sig_check(path, pub_a, &signer), 0);
    assert_string_equal(signer, "a.pem");
    assert_int_equal(sig_check(path, trusted, &signer), 0); /* a folder: a.pem and z.pem */
    assert_string_equal(signer, "a.pem");
    assert_int_equal(sig_check(path, pub_b, NULL), SERVD_EFORMAT); /* wrong key */
    assert_non_null(strstr(servd_last_error(), "does not verify with the trusted key b.pem"));
    assert_int_equal(sig_check(path, other, NULL), SERVD_EFORMAT);

    /* Re-signing with another key replaces the signature (one entry, same size). */
    assert_int_equal(mpk_sign(path, priv_b, path), 0);
    char *again;
    size_t glen;
    assert_int_equal(mpk__read_file(path, 1 << 30, &again, &glen), 0);
    assert_int_equal(glen, alen);
    free(again);
    free(after);
    assert_int_equal(sig_check(path, other, &signer), 0);
    assert_string_equal(signer, "b.pem");
    assert_int_equal(sig_check(path, trusted, NULL), SERVD_EFORMAT);

    /* The manifest changed after signing (CRC fixed, still valid JSON): the signature catches it. */
    assert_int_equal(mpk_sign(path, priv, path), 0);
    where mf = locate(path, "manifest.json");
    char *b;
    size_t len;
    assert_int_equal(mpk__read_file(path, 1 << 30, &b, &len), 0);
    char *name = memmem(b + mf.data, mf.size, "\"name\": \"t\"", 11);
    assert_non_null(name);
    name[9] = 'u';
    uint32_t crc = (uint32_t)crc32(0, (const Bytef *)b + mf.data, (uInt)mf.size);
    wr32((uint8_t *)b + mf.lcrc, crc);
    wr32((uint8_t *)b + mf.ccrc, crc);
    assert_int_equal(mpk__write_file(path, b, len), 0);
    free(b);
    assert_int_equal(mpk_open(path, &p), 0);
    assert_string_equal(mpk_name(p), "u");
    assert_int_equal(mpk_verify(p), 0); /* the hashes of the entries still hold */
    mpk_close(p);
    assert_int_equal(sig_check(path, pub_a, NULL), SERVD_EFORMAT);
    assert_non_null(strstr(servd_last_error(), "manifest.json changed after signing"));
  }
}

static void load_checks_with_keys(void **state) {
  (void)state;
  char kdir[400], priv[600], pub[600];
  snprintf(kdir, sizeof kdir, "%s/load-keys", dir);
  mkdir(kdir, 0700);
  keygen("ops", kdir);
  snprintf(priv, sizeof priv, "%s/ops.key", dir);
  snprintf(pub, sizeof pub, "%s/ops.pem", kdir);
  const char *path = write_pkg("load", false);
  char out[512];
  snprintf(out, sizeof out, "%s/load-signed.mpk", dir);
  assert_int_equal(mpk_sign(path, priv, out), 0); /* to another file: the input stays unsigned */
  mpk_load_checks c = {.verify_weights = true, .trusted_keys = kdir};
  char rep[256];
  mpk_package *p;
  assert_int_equal(mpk_open(path, &p), 0);
  assert_int_equal(mpk_load_check(p, &c, rep, sizeof rep), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "unsigned package"));
  mpk_close(p);
  assert_int_equal(mpk_open(out, &p), 0);
  assert_int_equal(mpk_load_check(p, &c, rep, sizeof rep), 0);
  assert_non_null(strstr(rep, "signed by ops.pem"));
  assert_non_null(strstr(rep, "weights included"));
  mpk_close(p);
  /* a signed package whose code was changed afterwards: the signature holds, the hash does not */
  tamper(out, "code/m/model.py", 0, true);
  assert_int_equal(mpk_open(out, &p), 0);
  assert_int_equal(mpk_load_check(p, &c, rep, sizeof rep), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "code/m/model.py"));
  mpk_close(p);
  /* signing refuses a package whose hashes do not hold */
  assert_int_equal(mpk_sign(out, priv, out), SERVD_EFORMAT);
}

static void bad_keys(void **state) {
  (void)state;
  char empty[400], junk[600], priv_as_pub[600];
  mpk_keyring *r = NULL;
  snprintf(empty, sizeof empty, "%s/empty-keys", dir);
  mkdir(empty, 0700);
  assert_int_equal(mpk_keyring_load(empty, &r), SERVD_EINVAL); /* a folder with no key */
  assert_null(r);
  snprintf(junk, sizeof junk, "%s/junk.pem", empty);
  assert_int_equal(mpk__write_file(junk, "not a key\n", 10), 0);
  assert_int_equal(mpk_keyring_load(empty, &r), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "junk.pem"));
  keygen("k", empty);
  snprintf(priv_as_pub, sizeof priv_as_pub, "%s/k.key", dir);
  assert_int_equal(mpk_keyring_load(priv_as_pub, &r), SERVD_EFORMAT); /* a private key is no public key */
  unlink(junk);
  assert_int_equal(mpk_keyring_load(empty, &r), 0);
  assert_int_equal(mpk_keyring_count(r), 1);
  mpk_keyring_free(r);
  mpk_keyring_free(NULL);
  /* an RSA key is refused for what it is */
  EVP_PKEY *rsa = EVP_PKEY_Q_keygen(NULL, NULL, "RSA", (size_t)1024);
  assert_non_null(rsa);
  char rpath[600];
  snprintf(rpath, sizeof rpath, "%s/rsa.pem", dir);
  FILE *f = fopen(rpath, "w");
  assert_non_null(f);
  assert_int_equal(PEM_write_PUBKEY(f, rsa), 1);
  fclose(f);
  EVP_PKEY_free(rsa);
  assert_int_equal(mpk_keyring_load(rpath, &r), SERVD_EFORMAT);
  assert_non_null(strstr(servd_last_error(), "expected Ed25519"));
  assert_int_equal(mpk_keyring_load("/nonexistent/keys", &r), SERVD_EIO);
}

int main(void) {
  const struct CMUnitTest tests[] = {cmocka_unit_test(tampered_code_refused), cmocka_unit_test(flipped_weight_refused),
                                     cmocka_unit_test(sign_roundtrip), cmocka_unit_test(load_checks_with_keys),
                                     cmocka_unit_test(bad_keys)};
  return cmocka_run_group_tests(tests, setup, teardown);
}
