/* The package cache (see package_cache.h for the layout, the key and the locking). */
#include "package_cache.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <openssl/evp.h>
#include <pwd.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "mpk/import.h"
#include "mpk/package.h"
#include "servd/status.h"

#define KEY_VERSION "servd-package-cache 1"
#define GGUF_HEAD (4u << 20) /* header, metadata and tensor table of usual GGUF files */
#define GGUF_SAMPLE (64u << 10)
#define GGUF_SAMPLES 16
#define JSON_WHOLE_MAX (64u << 20) /* *.json files hashed whole up to this size */
#define WALK_DEPTH 2

#define ACCEPTS \
  "servd accepts a model package (a .mpk zip built with `modelpkg pack SRC -o OUT.mpk`), a GGUF file, or a " \
  "Hugging Face model folder holding config.json; the last two are packed once into the package cache " \
  "(--package-cache DIR)"

int servd_source_detect(const char *path, servd_source_kind *kind) {
  struct stat st;
  if (stat(path, &st) != 0) return servd_fail(SERVD_EINVAL, "--model %s: %s. %s", path, strerror(errno), ACCEPTS);
  if (S_ISDIR(st.st_mode)) {
    char cfg[PATH_MAX];
    snprintf(cfg, sizeof cfg, "%s/config.json", path);
    if (access(cfg, R_OK) != 0)
      return servd_fail(SERVD_EINVAL, "--model %s: a folder without config.json is not a Hugging Face model. %s", path,
                        ACCEPTS);
    *kind = SERVD_SOURCE_HF;
    return 0;
  }
  unsigned char m[4] = {0};
  FILE *f = fopen(path, "rb");
  if (!f) return servd_fail(SERVD_EINVAL, "--model %s: %s", path, strerror(errno));
  size_t n = fread(m, 1, sizeof m, f);
  fclose(f);
  if (n == 4 && memcmp(m, "PK\3\4", 4) == 0) *kind = SERVD_SOURCE_PACKAGE;
  else if (n == 4 && memcmp(m, "GGUF", 4) == 0) *kind = SERVD_SOURCE_GGUF;
  else
    return servd_fail(SERVD_EINVAL,
                      "--model %s: neither a package nor a GGUF file (its first bytes are not "
                      "\"PK\\3\\4\" or \"GGUF\"). %s",
                      path, ACCEPTS);
  return 0;
}

int servd_package_cache_default_dir(char *out, size_t cap) {
  const char *xdg = getenv("XDG_CACHE_HOME");
  int k;
  if (xdg && xdg[0] == '/') { /* the XDG spec ignores relative values */
    k = snprintf(out, cap, "%s/servd/packages", xdg);
  } else {
    const char *home = getenv("HOME");
    struct passwd *pw;
    if ((!home || !home[0]) && (pw = getpwuid(getuid()))) home = pw->pw_dir;
    if (!home || !home[0])
      return servd_fail(SERVD_EINVAL,
                        "no package cache folder: neither XDG_CACHE_HOME nor HOME is set (give --package-cache DIR)");
    k = snprintf(out, cap, "%s/.cache/servd/packages", home);
  }
  if (k < 0 || (size_t)k >= cap) return servd_fail(SERVD_EINVAL, "package cache folder: path too long");
  return 0;
}

/* mkdir -p; what it creates is 0700 (packages may hold private weights). */
static int make_dirs(const char *dir) {
  char p[PATH_MAX];
  if (snprintf(p, sizeof p, "%s", dir) >= (int)sizeof p)
    return servd_fail(SERVD_ERANGE, "--package-cache: path too long");
  for (char *s = p + 1;; s++) {
    if (*s != '/' && *s) continue;
    char c = *s;
    *s = 0;
    if (mkdir(p, 0700) != 0 && errno != EEXIST)
      return servd_fail(SERVD_EIO, "package cache %s: cannot create %s: %s", dir, p, strerror(errno));
    *s = c;
    if (!c) break;
  }
  struct stat st;
  if (stat(dir, &st) != 0 || !S_ISDIR(st.st_mode)) return servd_fail(SERVD_EIO, "package cache %s: not a folder", dir);
  return 0;
}

/* ---- the key ---------------------------------------------------------------------------------- */

static void h_bytes(EVP_MD_CTX *h, const void *p, size_t n) { EVP_DigestUpdate(h, p, n); }
static void h_str(EVP_MD_CTX *h, const char *s) { h_bytes(h, s, strlen(s) + 1); }
static void h_u64(EVP_MD_CTX *h, uint64_t v) { h_bytes(h, &v, sizeof v); }
static void h_stat(EVP_MD_CTX *h, const struct stat *st) {
  h_u64(h, (uint64_t)st->st_size);
  h_u64(h, (uint64_t)st->st_mtim.tv_sec);
  h_u64(h, (uint64_t)st->st_mtim.tv_nsec);
}

static int h_range(EVP_MD_CTX *h, int fd, uint64_t off, size_t len, unsigned char *buf) {
  ssize_t n = pread(fd, buf, len, (off_t)off);
  if (n < 0) return -1;
  h_bytes(h, buf, (size_t)n);
  return 0;
}

static int h_file(EVP_MD_CTX *h, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno));
  unsigned char buf[1 << 16];
  ssize_t n;
  while ((n = read(fd, buf, sizeof buf)) > 0) h_bytes(h, buf, (size_t)n);
  close(fd);
  return n < 0 ? servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno)) : 0;
}

static int h_gguf(EVP_MD_CTX *h, const char *path) {
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno));
  struct stat st;
  unsigned char *buf = malloc(GGUF_HEAD);
  int rc = 0;
  if (!buf || fstat(fd, &st) != 0) {
    rc = servd_fail(buf ? SERVD_EIO : SERVD_ENOMEM, "%s: %s", path, buf ? strerror(errno) : "out of memory");
    goto out;
  }
  h_stat(h, &st);
  h_u64(h, (uint64_t)st.st_ino);
  uint64_t size = (uint64_t)st.st_size;
  bool bad = h_range(h, fd, 0, GGUF_HEAD, buf) != 0;
  for (int i = 1; i < GGUF_SAMPLES && !bad; i++)
    bad = h_range(h, fd, size / GGUF_SAMPLES * (uint64_t)i, GGUF_SAMPLE, buf) != 0;
  if (!bad && size > GGUF_SAMPLE) bad = h_range(h, fd, size - GGUF_SAMPLE, GGUF_SAMPLE, buf) != 0;
  if (bad) rc = servd_fail(SERVD_EIO, "%s: %s", path, strerror(errno));
out:
  free(buf);
  close(fd);
  return rc;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

/* Names, sizes and mtimes under dir in a fixed order; with json_whole, *.json contents too. Skips dot
 * entries (.git, .cache of huggingface_hub) and Python's byte-code (rewritten when code runs). */
static int h_tree(EVP_MD_CTX *h, const char *dir, const char *rel, int depth, bool json_whole) {
  struct dirent **ents;
  int n = scandir(dir, &ents, NULL, alphasort);
  if (n < 0) return servd_fail(SERVD_EIO, "%s: %s", dir, strerror(errno));
  int rc = 0;
  for (int i = 0; i < n; i++) {
    const char *name = ents[i]->d_name;
    char path[PATH_MAX], sub[PATH_MAX];
    struct stat st;
    if (rc || name[0] == '.' || strcmp(name, "__pycache__") == 0 || ends_with(name, ".pyc")) continue;
    snprintf(path, sizeof path, "%s/%s", dir, name);
    snprintf(sub, sizeof sub, "%s%s%s", rel, rel[0] ? "/" : "", name);
    if (stat(path, &st) != 0) continue; /* a dangling link packs as nothing either */
    if (S_ISDIR(st.st_mode)) {
      if (depth > 0) rc = h_tree(h, path, sub, depth - 1, json_whole);
      continue;
    }
    if (!S_ISREG(st.st_mode)) continue;
    h_str(h, sub);
    h_stat(h, &st);
    if (json_whole && ends_with(name, ".json") && (uint64_t)st.st_size <= JSON_WHOLE_MAX) rc = h_file(h, path);
  }
  for (int i = 0; i < n; i++) free(ents[i]);
  free(ents);
  return rc;
}

/* The model code that goes into the package: $SERVD_MODEL_CODE, else every family's folder (the
 * parent of the default one), since the family is known only once the source is parsed. */
static int h_code(EVP_MD_CTX *h) {
  const char *code = mpk_default_code_dir();
  if (!code) return 0; /* the import fails and says why */
  char root[PATH_MAX];
  snprintf(root, sizeof root, "%s", code);
  const char *env = getenv("SERVD_MODEL_CODE");
  char *slash = strrchr(root, '/');
  if (!(env && env[0]) && slash && slash != root) *slash = 0;
  h_str(h, root);
  return h_tree(h, root, "", 3, false);
}

static int source_key(const char *src, servd_source_kind kind, const mpk_import_options *o, char hex[65]) {
  EVP_MD_CTX *h = EVP_MD_CTX_new();
  if (!h || EVP_DigestInit_ex(h, EVP_sha256(), NULL) != 1) {
    EVP_MD_CTX_free(h);
    return servd_fail(SERVD_ENOMEM, "package cache: cannot start SHA-256");
  }
  h_str(h, KEY_VERSION);
  h_u64(h, (uint64_t)kind);
  h_u64(h, (uint64_t)o->dtype);
  struct stat st;
  if (stat("/proc/self/exe", &st) == 0) h_stat(h, &st);
  int rc = kind == SERVD_SOURCE_GGUF ? h_gguf(h, src) : h_tree(h, src, "", WALK_DEPTH, true);
  if (!rc) rc = h_code(h);
  unsigned char md[32];
  unsigned int len = 0;
  EVP_DigestFinal_ex(h, md, &len);
  EVP_MD_CTX_free(h);
  for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", md[i]);
  return rc;
}

static void sha_hex(const char *s, char hex[65]) {
  unsigned char md[32];
  unsigned int len = 0;
  EVP_Digest(s, strlen(s), md, &len, EVP_sha256(), NULL);
  for (int i = 0; i < 32; i++) sprintf(hex + 2 * i, "%02x", md[i]);
}

/* The source's base name without a .gguf suffix, reduced to [A-Za-z0-9._-]. */
static void source_stem(const char *abs, char *out, size_t cap) {
  char tmp[PATH_MAX];
  snprintf(tmp, sizeof tmp, "%s", abs);
  size_t l = strlen(tmp);
  while (l > 1 && tmp[l - 1] == '/') tmp[--l] = 0;
  const char *base = strrchr(tmp, '/') ? strrchr(tmp, '/') + 1 : tmp;
  size_t j = 0;
  for (const char *p = base; *p && j + 1 < cap && j < 64; p++)
    out[j++] = (char)((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '.' ||
                              *p == '_' || *p == '-'
                          ? *p
                          : '_');
  out[j] = 0;
  if (j > 5 && strcmp(out + j - 5, ".gguf") == 0) out[j - 5] = 0;
  if (!out[0] || strcmp(out, ".") == 0) snprintf(out, cap, "model");
}

/* ---- building --------------------------------------------------------------------------------- */

static double now_s(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

typedef struct progress_log {
  const char *src;
  double t0, last;
} progress_log;

/* A line every 10 s: packing a large model takes minutes and the log must show it is alive. */
static void on_progress(void *ctx, uint64_t done, uint64_t total) {
  progress_log *p = ctx;
  double t = now_s();
  if (t - p->last < 10 || done >= total) return;
  p->last = t;
  fprintf(stderr, "servd: packing %s: %.0f%% (%.1f of %.1f MB)\n", p->src,
          total ? 100.0 * (double)done / (double)total : 0.0, (double)done / 1e6, (double)total / 1e6);
}

/* Removes <prefix>*.mpk entries but `keep`, and <prefix>*.tmp.* leftovers of a build that died (the
 * lock is held: no other process writes them now). */
static void remove_stale(const char *dir, const char *prefix, const char *keep) {
  DIR *d = opendir(dir);
  if (!d) return;
  size_t pl = strlen(prefix);
  for (struct dirent *e; (e = readdir(d));) {
    if (strncmp(e->d_name, prefix, pl) != 0 || strcmp(e->d_name, keep) == 0) continue;
    if (!ends_with(e->d_name, ".mpk") && !strstr(e->d_name, ".mpk.tmp.")) continue;
    if (unlinkat(dirfd(d), e->d_name, 0) == 0 && ends_with(e->d_name, ".mpk"))
      fprintf(stderr, "servd: package cache: removed %s/%s (built from an older version of the source)\n", dir,
              e->d_name);
  }
  closedir(d);
}

static bool package_opens(const char *path, char *why, size_t cap) {
  mpk_package *p = NULL;
  if (mpk_open(path, &p) == 0) {
    mpk_close(p);
    return true;
  }
  snprintf(why, cap, "%s", servd_last_error());
  return false;
}

int servd_package_cache_resolve(const char *dir, const char *src, char **out) {
  *out = NULL;
  servd_source_kind kind;
  int rc = servd_source_detect(src, &kind);
  if (rc) return rc;
  if (kind == SERVD_SOURCE_PACKAGE) return (*out = strdup(src)) ? 0 : servd_fail(SERVD_ENOMEM, "out of memory");

  char why[512], def[PATH_MAX], abs[PATH_MAX], key[65], sid[65], stem[80], prefix[128], name[192], pkg[PATH_MAX],
      lock[PATH_MAX];
  if (!dir && (rc = servd_package_cache_default_dir(def, sizeof def))) return rc;
  if (!dir) dir = def;
  if (!realpath(src, abs)) return servd_fail(SERVD_EINVAL, "--model %s: %s", src, strerror(errno));
  if ((rc = make_dirs(dir))) goto unusable;
  mpk_import_options o;
  mpk_import_options_init(&o);
  if ((rc = source_key(abs, kind, &o, key))) return rc;
  sha_hex(abs, sid);
  source_stem(abs, stem, sizeof stem);
  snprintf(prefix, sizeof prefix, "%s-%.8s-", stem, sid);
  snprintf(name, sizeof name, "%s%.16s.mpk", prefix, key);
  if (snprintf(pkg, sizeof pkg, "%s/%s", dir, name) >= (int)sizeof pkg ||
      snprintf(lock, sizeof lock, "%s/%s-%.8s.lock", dir, stem, sid) >= (int)sizeof lock)
    return servd_fail(SERVD_EINVAL, "package cache %s: path too long", dir);

  /* The lock file stays: unlinking it would let a third process lock a fresh inode while a second
   * still holds the old one. */
  int fd = open(lock, O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    rc = servd_fail(SERVD_EIO, "package cache %s: cannot write in it (%s: %s)", dir, lock, strerror(errno));
    goto unusable;
  }
  if (flock(fd, LOCK_EX | LOCK_NB) != 0) {
    fprintf(stderr, "servd: package cache: another process is packing %s; waiting for it\n", src);
    while (flock(fd, LOCK_EX) != 0 && errno == EINTR) {}
  }
  if (access(pkg, F_OK) == 0) {
    if (package_opens(pkg, why, sizeof why)) {
      fprintf(stderr, "servd: package cache: reused %s for %s\n", pkg, src);
      goto done;
    }
    fprintf(stderr, "servd: package cache: %s does not open (%s); rebuilding it once\n", pkg, why);
    unlink(pkg);
  } else if (access(dir, W_OK) != 0) {
    rc = servd_fail(SERVD_EIO, "package cache %s: cannot write in it (%s)", dir, strerror(errno));
    flock(fd, LOCK_UN);
    close(fd);
    goto unusable;
  }
  fprintf(stderr, "servd: package cache: packing %s (%s) into %s\n", src,
          kind == SERVD_SOURCE_GGUF ? "GGUF" : "Hugging Face folder", pkg);
  progress_log pl = {src, now_s(), now_s()};
  o.progress = on_progress;
  o.progress_ctx = &pl;
  rc = kind == SERVD_SOURCE_GGUF ? mpk_pack_gguf(abs, pkg, &o) : mpk_pack_hf(abs, pkg, &o);
  if (rc) {
    snprintf(why, sizeof why, "%s", servd_last_error()); /* servd_fail must not read its own buffer */
    /* EINVAL is kept for what the operator must fix in the command line */
    rc = servd_fail(rc == SERVD_EINVAL ? SERVD_EFORMAT : rc, "packing %s into the package cache: %s", src, why);
    goto unlock;
  }
  struct stat st;
  stat(pkg, &st);
  fprintf(stderr, "servd: package cache: built %s (%.1f MB) in %.2f s\n", pkg, (double)st.st_size / 1e6,
          now_s() - pl.t0);
  remove_stale(dir, prefix, name);
done:
  if (!(*out = strdup(pkg))) rc = servd_fail(SERVD_ENOMEM, "out of memory");
unlock:
  flock(fd, LOCK_UN);
  close(fd);
  return rc;
unusable:
  snprintf(why, sizeof why, "%s", servd_last_error());
  return servd_fail(SERVD_EINVAL,
                    "%s. Give a writable folder with --package-cache DIR (config key package_cache), or pack the "
                    "model yourself (`modelpkg pack %s -o MODEL.mpk`) and serve the package",
                    why, src);
}
