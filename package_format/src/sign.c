/* Ed25519 signatures of packages (OpenSSL EVP): key files, checking the signature entry, and
 * `modelpkg sign`, which appends the signature entry to a package without rewriting its other
 * entries: the bytes before the central directory are copied as they are (copy_file_range), the
 * signature entry follows them (64-byte aligned like every entry), then the old central directory
 * records, the new one and the end records. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>
#include <openssl/err.h>
#include <openssl/evp.h>
#include <openssl/pem.h>

#include "mpk-impl.h"
#include "mpk/integrity.h"
#include "mpk/writer.h"

#define MAX_KEYS 256
#define MAX_KEY_FILE 65536

typedef struct key {
  EVP_PKEY *pkey;
  char *name; /* file name, for messages */
} key;

struct mpk_keyring {
  key *k;
  int n;
};

static const char *ssl_err(void) {
  static _Thread_local char buf[256];
  unsigned long e = ERR_get_error();
  if (!e) return "not a PEM key";
  ERR_error_string_n(e, buf, sizeof buf);
  ERR_clear_error();
  return buf;
}

/* Reads one PEM key (public, or private when `priv`) and checks that it is Ed25519. */
static int read_key(const char *path, bool priv, EVP_PKEY **out) {
  *out = NULL;
  char *pem = NULL;
  size_t len = 0;
  int rc = mpk__read_file(path, MAX_KEY_FILE, &pem, &len);
  if (rc) return rc;
  BIO *b = BIO_new_mem_buf(pem, (int)len);
  EVP_PKEY *k =
      b ? (priv ? PEM_read_bio_PrivateKey(b, NULL, NULL, NULL) : PEM_read_bio_PUBKEY(b, NULL, NULL, NULL)) : NULL;
  BIO_free(b);
  free(pem);
  if (!k)
    return servd_fail(SERVD_EFORMAT, "%s: expected an Ed25519 %s key in PEM form (%s): %s", path,
                      priv ? "private" : "public", priv ? "openssl genpkey -algorithm ed25519" : "openssl pkey -pubout",
                      ssl_err());
  if (EVP_PKEY_get_id(k) != EVP_PKEY_ED25519) {
    EVP_PKEY_free(k);
    return servd_fail(SERVD_EFORMAT, "%s: a %s key, expected Ed25519", path, priv ? "private" : "public");
  }
  *out = k;
  return 0;
}

static int add_key(mpk_keyring *r, const char *path, const char *name) {
  if (r->n == MAX_KEYS) return servd_fail(SERVD_ERANGE, "%s: more than %d keys", path, MAX_KEYS);
  EVP_PKEY *k;
  int rc = read_key(path, false, &k);
  if (rc) return rc;
  char *nm = strdup(name);
  if (!nm) {
    EVP_PKEY_free(k);
    return servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
  }
  r->k[r->n++] = (key){k, nm};
  return 0;
}

static int cmp_str(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

int mpk_keyring_load(const char *path, mpk_keyring **out) {
  *out = NULL;
  int rc = 0;
  DIR *d = NULL;
  char **names = NULL;
  size_t nn = 0;
  mpk_keyring *r = calloc(1, sizeof *r);
  if (!r || !(r->k = calloc(MAX_KEYS, sizeof *r->k))) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  struct stat st;
  if (stat(path, &st) != 0) {
    rc = servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno));
    goto fail;
  }
  if (!S_ISDIR(st.st_mode)) {
    char *copy = strdup(path);
    if (!copy) {
      rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
      goto fail;
    }
    rc = add_key(r, path, basename(copy));
    free(copy);
    if (rc) goto fail;
    *out = r;
    return 0;
  }
  if (!(d = opendir(path))) {
    rc = servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno));
    goto fail;
  }
  names = calloc(MAX_KEYS + 1, sizeof *names);
  if (!names) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
    goto fail;
  }
  for (struct dirent *de; (de = readdir(d));) {
    size_t l = strlen(de->d_name);
    if (de->d_name[0] == '.' || l < 5 || strcmp(de->d_name + l - 4, ".pem")) continue;
    if (nn == MAX_KEYS) {
      rc = servd_fail(SERVD_ERANGE, "%s: more than %d keys", path, MAX_KEYS);
      goto fail;
    }
    if (!(names[nn++] = strdup(de->d_name))) {
      rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", path);
      goto fail;
    }
  }
  qsort(names, nn, sizeof *names, cmp_str); /* a fixed order: the first key that verifies is reported */
  for (size_t i = 0; i < nn; i++) {
    char full[4096];
    snprintf(full, sizeof full, "%s/%s", path, names[i]);
    if ((rc = add_key(r, full, names[i]))) goto fail;
  }
  if (r->n == 0) {
    rc = servd_fail(SERVD_EINVAL,
                    "%s: no *.pem public keys in this folder (openssl pkey -in KEY -pubout -out %s/NAME.pem)", path,
                    path);
    goto fail;
  }
  *out = r;
  r = NULL;
fail:
  for (size_t i = 0; names && i < nn; i++) free(names[i]);
  free(names);
  if (d) closedir(d);
  mpk_keyring_free(r);
  return rc;
}

void mpk_keyring_free(mpk_keyring *r) {
  if (!r) return;
  for (int i = 0; r->k && i < r->n; i++) {
    EVP_PKEY_free(r->k[i].pkey);
    free(r->k[i].name);
  }
  free(r->k);
  free(r);
}

int mpk_keyring_count(const mpk_keyring *r) { return r ? r->n : 0; }

static bool ed25519_ok(EVP_PKEY *k, const void *msg, size_t len, const uint8_t *sig) {
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  bool ok = ctx && EVP_DigestVerifyInit(ctx, NULL, NULL, NULL, k) == 1 &&
            EVP_DigestVerify(ctx, sig, MPK_SIGNATURE_BYTES, msg, len) == 1;
  EVP_MD_CTX_free(ctx);
  ERR_clear_error();
  return ok;
}

int mpk_signature_check(mpk_package *p, const mpk_keyring *keys, const char **signer) {
  const void *man, *sig;
  size_t mlen, slen;
  if (signer) *signer = NULL;
  if (mpk_file(p, MPK_SIGNATURE_ENTRY, &sig, &slen))
    return servd_fail(SERVD_EFORMAT,
                      "%s: unsigned package (no %s entry), and only packages signed by a trusted key are "
                      "accepted (modelpkg sign --key PRIVATE.pem)",
                      mpk_path(p), MPK_SIGNATURE_ENTRY);
  if (mpk_file(p, "manifest.json", &man, &mlen)) return SERVD_EFORMAT;
  if (slen != MPK_SIGNATURE_BYTES)
    return servd_fail(SERVD_EFORMAT, "%s: %s: %zu bytes, expected %d", mpk_path(p), MPK_SIGNATURE_ENTRY, slen,
                      MPK_SIGNATURE_BYTES);
  for (int i = 0; keys && i < keys->n; i++) {
    if (ed25519_ok(keys->k[i].pkey, man, mlen, sig)) {
      if (signer) *signer = keys->k[i].name;
      return 0;
    }
  }
  char which[300];
  if (keys && keys->n == 1) snprintf(which, sizeof which, "the trusted key %s", keys->k[0].name);
  else snprintf(which, sizeof which, "any of the %d trusted keys", keys ? keys->n : 0);
  return servd_fail(SERVD_EFORMAT,
                    "%s: %s does not verify with %s (signed by another key, or manifest.json changed after "
                    "signing)",
                    mpk_path(p), MPK_SIGNATURE_ENTRY, which);
}

/* ---- signing ---------------------------------------------------------------------------------- */

#define PAD_ID 0x4246 /* the padding extra field of the writer */

static int write_all(int fd, const char *tmp, const void *data, size_t len) {
  const char *p = data;
  while (len) {
    ssize_t k = write(fd, p, len);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return servd_fail(SERVD_EIO, "%s: write failed: %s", tmp, k < 0 ? strerror(errno) : "no progress");
    p += k;
    len -= (size_t)k;
  }
  return 0;
}

/* Copies [0, len) of `in` to `out` (at its current offset), in the kernel where it can. */
static int copy_prefix(int in, int out, uint64_t len, const uint8_t *mapped, const char *tmp) {
  loff_t off = 0;
  while ((uint64_t)off < len) {
    ssize_t k = copy_file_range(in, &off, out, NULL,
                                (size_t)(len - (uint64_t)off > (1u << 30) ? (1u << 30) : len - (uint64_t)off), 0);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) break; /* unsupported across these files: write the rest from the mapping */
  }
  return (uint64_t)off < len ? write_all(out, tmp, mapped + off, (size_t)(len - (uint64_t)off)) : 0;
}

static int sign_manifest(const char *key_path, const void *msg, size_t len, uint8_t sig[MPK_SIGNATURE_BYTES]) {
  EVP_PKEY *k;
  int rc = read_key(key_path, true, &k);
  if (rc) return rc;
  EVP_MD_CTX *ctx = EVP_MD_CTX_new();
  size_t slen = MPK_SIGNATURE_BYTES;
  if (!ctx || EVP_DigestSignInit(ctx, NULL, NULL, NULL, k) != 1 || EVP_DigestSign(ctx, sig, &slen, msg, len) != 1 ||
      slen != MPK_SIGNATURE_BYTES)
    rc = servd_fail(SERVD_EINVAL, "%s: signing failed: %s", key_path, ssl_err());
  EVP_MD_CTX_free(ctx);
  EVP_PKEY_free(k);
  return rc;
}

/* Central directory and end records: the old records minus an old signature's, then `sig_lho`'s. */
static int write_tail(int fd, const char *tmp, const uint8_t *base, const mpk_zip *z, uint64_t sig_lho,
                      uint32_t sig_crc) {
  int rc;
  const char *name = MPK_SIGNATURE_ENTRY;
  size_t nlen = strlen(name);
  /* The signature's local header: 30 + name + padding field (4 + pad), then its data. */
  size_t fixed = 30 + nlen + 4, pad = (SERVD_ALIGN - (sig_lho + fixed) % SERVD_ALIGN) % SERVD_ALIGN;
  uint64_t cd_start = sig_lho + fixed + pad + MPK_SIGNATURE_BYTES, n = 0, cd_size = 0;
  uint64_t p = z->cd_offset;
  for (size_t i = 0; i < z->n; i++) {
    const uint8_t *c = base + p;
    size_t rl = 46 + (size_t)rd16(c + 28) + rd16(c + 30) + rd16(c + 32);
    if (strcmp(z->e[i].name, name)) {
      if ((rc = write_all(fd, tmp, c, rl))) return rc;
      cd_size += rl;
      n++;
    }
    p += rl;
  }
  bool zo = sig_lho >= 0xFFFFFFFFull;
  uint8_t h[46 + 32 + 12];
  wr32(h, 0x02014b50);
  wr16(h + 4, (3 << 8) | 45); /* made by: unix, 4.5 */
  wr16(h + 6, zo ? 45 : 20);
  wr16(h + 8, 0x0800);
  wr16(h + 10, 0);
  wr16(h + 12, 0);
  wr16(h + 14, 0x21); /* 1980-01-01 00:00, as the writer */
  wr32(h + 16, sig_crc);
  wr32(h + 20, MPK_SIGNATURE_BYTES);
  wr32(h + 24, MPK_SIGNATURE_BYTES);
  wr16(h + 28, (uint16_t)nlen);
  wr16(h + 30, zo ? 12 : 0);
  wr16(h + 32, 0);
  wr16(h + 34, 0);
  wr16(h + 36, 0);
  wr32(h + 38, 0100644u << 16);
  wr32(h + 42, zo ? 0xFFFFFFFFu : (uint32_t)sig_lho);
  memcpy(h + 46, name, nlen);
  if (zo) {
    wr16(h + 46 + nlen, 0x0001);
    wr16(h + 48 + nlen, 8);
    wr64(h + 50 + nlen, sig_lho);
  }
  size_t hl = 46 + nlen + (zo ? 12 : 0);
  if ((rc = write_all(fd, tmp, h, hl))) return rc;
  cd_size += hl;
  n++;
  bool z64 = n >= 0xFFFF || cd_start >= 0xFFFFFFFFull || cd_size >= 0xFFFFFFFFull;
  uint8_t t[MPK_ZIP_END_MAX];
  return write_all(fd, tmp, t, mpk__zip_end_records(t, n, cd_start, cd_size, z64));
}

int mpk_sign(const char *path, const char *key_path, const char *out_path) {
  int rc = 0, fd = -1;
  mpk_package *pkg = NULL;
  mpk_map map = {0};
  mpk_zip z = {0};
  char *tmp = NULL;
  uint8_t sig[MPK_SIGNATURE_BYTES];
  const void *man;
  size_t mlen;
  /* Only a package whose hashes hold is worth signing: the signature vouches for them. */
  if ((rc = mpk_open(path, &pkg)) || (rc = mpk_verify_entries(pkg, MPK_VERIFY_ALL))) goto fail;
  if ((rc = mpk_file(pkg, "manifest.json", &man, &mlen)) || (rc = sign_manifest(key_path, man, mlen, sig))) goto fail;
  if ((rc = mpk__map_file_fd(path, &map)) || (rc = mpk__zip_parse(path, map.data, map.len, &z))) goto fail;
  /* Everything before the signature entry (an old one must be the last entry) or the directory. */
  uint64_t keep = z.cd_offset;
  int old = mpk__zip_find(&z, MPK_SIGNATURE_ENTRY);
  if (old >= 0) {
    if (z.e[old].data + z.e[old].csize != z.cd_offset) {
      rc = servd_fail(SERVD_EFORMAT, "%s: %s is not the last entry; cannot replace it", path, MPK_SIGNATURE_ENTRY);
      goto fail;
    }
    keep = z.e[old].lho;
  }
  size_t tl = strlen(out_path) + 16;
  if (!(tmp = malloc(tl))) {
    rc = servd_fail(SERVD_ENOMEM, "%s: out of memory", out_path);
    goto fail;
  }
  snprintf(tmp, tl, "%s.tmp.XXXXXX", out_path);
  if ((fd = mkstemp(tmp)) < 0) {
    rc = servd_fail(SERVD_EIO, "%s: cannot create a temporary file: %s", tmp, strerror(errno));
    free(tmp);
    tmp = NULL;
    goto fail;
  }
  struct stat st;
  fchmod(fd, fstat(map.fd, &st) == 0 ? (st.st_mode & 07777) : 0644); /* keep the package's mode */
  if ((rc = copy_prefix(map.fd, fd, keep, map.data, tmp))) goto fail;
  const char *name = MPK_SIGNATURE_ENTRY;
  size_t nlen = strlen(name), fixed = 30 + nlen + 4, pad = (SERVD_ALIGN - (keep + fixed) % SERVD_ALIGN) % SERVD_ALIGN;
  uint32_t crc = (uint32_t)crc32(0, sig, MPK_SIGNATURE_BYTES);
  uint8_t h[30 + 32 + 4 + 64];
  wr32(h, 0x04034b50);
  wr16(h + 4, 20);
  wr16(h + 6, 0x0800); /* UTF-8 names */
  wr16(h + 8, 0);      /* stored */
  wr16(h + 10, 0);
  wr16(h + 12, 0x21);
  wr32(h + 14, crc);
  wr32(h + 18, MPK_SIGNATURE_BYTES);
  wr32(h + 22, MPK_SIGNATURE_BYTES);
  wr16(h + 26, (uint16_t)nlen);
  wr16(h + 28, (uint16_t)(4 + pad));
  memcpy(h + 30, name, nlen);
  wr16(h + 30 + nlen, PAD_ID);
  wr16(h + 32 + nlen, (uint16_t)pad);
  memset(h + 34 + nlen, 0, pad);
  if ((rc = write_all(fd, tmp, h, fixed + pad)) || (rc = write_all(fd, tmp, sig, sizeof sig)) ||
      (rc = write_tail(fd, tmp, map.data, &z, keep, crc)))
    goto fail;
  if (fsync(fd) != 0) {
    rc = servd_fail(SERVD_EIO, "%s: fsync failed: %s", tmp, strerror(errno));
    goto fail;
  }
  close(fd);
  fd = -1;
  if (rename(tmp, out_path) != 0) {
    rc = servd_fail(SERVD_EIO, "%s: rename from %s failed: %s", out_path, tmp, strerror(errno));
    goto fail;
  }
  free(tmp);
  tmp = NULL;
fail:
  if (fd >= 0) close(fd);
  if (tmp) {
    unlink(tmp);
    free(tmp);
  }
  mpk__zip_free(&z);
  mpk__unmap(&map);
  mpk_close(pkg);
  return rc;
}
