/* The package cache (daemon/package_cache.c) on a real source: a tiny random-weight Llama written as
 * a Hugging Face folder by mpk_synth, packed with the build tree's model code.
 *
 * Oracle: sources are told by their first bytes; the first resolve writes a package that opens and
 * whose name holds the key; a second resolve returns the same file untouched (inode, mtime) and adds
 * nothing to the folder; a changed source gets a new entry and the old one is removed; a truncated
 * entry is rebuilt; an unusable folder and a non-model path fail with messages saying what to do. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <unistd.h>

#include <cmocka.h>

#include "mpk/import.h"
#include "mpk/package.h"
#include "package_cache.h"
#include "servd/status.h"

static char root[256];

static void write_file(const char *path, const void *data, size_t n) {
  FILE *f = fopen(path, "wb");
  assert_non_null(f);
  assert_int_equal(fwrite(data, 1, n, f), n);
  fclose(f);
}

static int count_entries(const char *dir, const char *suffix) {
  DIR *d = opendir(dir);
  if (!d) return -1;
  int n = 0;
  for (struct dirent *e; (e = readdir(d));) {
    size_t l = strlen(e->d_name), s = strlen(suffix);
    if (e->d_name[0] != '.' && l >= s && strcmp(e->d_name + l - s, suffix) == 0) n++;
  }
  closedir(d);
  return n;
}

static void test_detect(void **state) {
  (void)state;
  char p[512];
  servd_source_kind k;
  snprintf(p, sizeof p, "%s/a.bin", root);
  write_file(p, "PK\3\4rest", 8);
  assert_int_equal(servd_source_detect(p, &k), 0);
  assert_int_equal(k, SERVD_SOURCE_PACKAGE);
  write_file(p, "GGUF\3\0\0\0", 8); /* the name says nothing: the bytes decide */
  assert_int_equal(servd_source_detect(p, &k), 0);
  assert_int_equal(k, SERVD_SOURCE_GGUF);
  snprintf(p, sizeof p, "%s/notes.gguf", root);
  write_file(p, "just some text\n", 15);
  assert_int_equal(servd_source_detect(p, &k), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "modelpkg pack"));
  assert_non_null(strstr(servd_last_error(), "GGUF file"));
  assert_non_null(strstr(servd_last_error(), "config.json"));
  snprintf(p, sizeof p, "%s/emptydir", root);
  assert_int_equal(mkdir(p, 0755), 0);
  assert_int_equal(servd_source_detect(p, &k), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "without config.json"));
  snprintf(p, sizeof p, "%s/missing.mpk", root);
  assert_int_equal(servd_source_detect(p, &k), SERVD_EINVAL);
  assert_non_null(strstr(servd_last_error(), "No such file"));
}

static void test_default_dir(void **state) {
  (void)state;
  char d[512];
  char *xdg = getenv("XDG_CACHE_HOME") ? strdup(getenv("XDG_CACHE_HOME")) : NULL;
  char *home = getenv("HOME") ? strdup(getenv("HOME")) : NULL;
  setenv("XDG_CACHE_HOME", "/x/cache", 1);
  assert_int_equal(servd_package_cache_default_dir(d, sizeof d), 0);
  assert_string_equal(d, "/x/cache/servd/packages");
  setenv("XDG_CACHE_HOME", "relative", 1); /* ignored, as the XDG spec says */
  setenv("HOME", "/home/op", 1);
  assert_int_equal(servd_package_cache_default_dir(d, sizeof d), 0);
  assert_string_equal(d, "/home/op/.cache/servd/packages");
  if (xdg) setenv("XDG_CACHE_HOME", xdg, 1);
  else unsetenv("XDG_CACHE_HOME");
  if (home) setenv("HOME", home, 1);
  free(xdg);
  free(home);
}

static void test_package_passes_through(void **state) {
  (void)state;
  char p[512], cache[512];
  snprintf(p, sizeof p, "%s/ready.mpk", root);
  write_file(p, "PK\3\4", 4);
  snprintf(cache, sizeof cache, "%s/unused-cache", root);
  char *out = NULL;
  assert_int_equal(servd_package_cache_resolve(cache, p, &out), 0);
  assert_string_equal(out, p);
  free(out);
  assert_int_equal(access(cache, F_OK), -1); /* no folder made for a package */
}

static void test_hf_build_reuse_rebuild(void **state) {
  (void)state;
  char hf[512], cache[512], cfg[600];
  snprintf(hf, sizeof hf, "%s/tiny-hf", root);
  snprintf(cache, sizeof cache, "%s/cache/servd/packages", root);
  mpk_import_options o;
  mpk_import_options_init(&o);
  if (mpk_synth("tiny", 1, SERVD_F32, hf, NULL, &o) != 0) fail_msg("mpk_synth: %s", servd_last_error());

  char *first = NULL;
  if (servd_package_cache_resolve(cache, hf, &first) != 0) fail_msg("resolve: %s", servd_last_error());
  struct stat st, st2;
  assert_int_equal(stat(cache, &st), 0);
  assert_int_equal(st.st_mode & 0777, 0700);
  assert_non_null(strstr(first, cache));
  assert_non_null(strstr(first, "/tiny-hf-"));
  mpk_package *p = NULL;
  assert_int_equal(mpk_open(first, &p), 0);
  assert_string_equal(mpk_kind(p), "causal-lm");
  mpk_close(p);
  assert_int_equal(count_entries(cache, ".mpk"), 1);

  /* Reused: the same file, not rewritten, nothing added to the folder. */
  assert_int_equal(stat(first, &st), 0);
  struct stat dir1, dir2;
  assert_int_equal(stat(cache, &dir1), 0);
  char *again = NULL;
  assert_int_equal(servd_package_cache_resolve(cache, hf, &again), 0);
  assert_string_equal(again, first);
  assert_int_equal(stat(again, &st2), 0);
  assert_int_equal(st.st_ino, st2.st_ino);
  assert_true(st.st_mtim.tv_sec == st2.st_mtim.tv_sec && st.st_mtim.tv_nsec == st2.st_mtim.tv_nsec);
  assert_int_equal(stat(cache, &dir2), 0);
  assert_true(dir1.st_mtim.tv_sec == dir2.st_mtim.tv_sec && dir1.st_mtim.tv_nsec == dir2.st_mtim.tv_nsec);
  free(again);

  /* A truncated entry does not open: rebuilt in place. */
  assert_int_equal(truncate(first, 100), 0);
  assert_int_equal(servd_package_cache_resolve(cache, hf, &again), 0);
  assert_string_equal(again, first);
  assert_int_equal(mpk_open(again, &p), 0);
  mpk_close(p);
  free(again);

  /* A changed source (config.json rewritten: new mtime) gets a new entry; the old one goes. */
  snprintf(cfg, sizeof cfg, "%s/config.json", hf);
  struct timeval tv[2] = {{1000000000, 0}, {1000000000, 0}};
  assert_int_equal(utimes(cfg, tv), 0);
  assert_int_equal(servd_package_cache_resolve(cache, hf, &again), 0);
  assert_string_not_equal(again, first);
  assert_int_equal(access(again, R_OK), 0);
  assert_int_equal(access(first, F_OK), -1);
  assert_int_equal(count_entries(cache, ".mpk"), 1);
  assert_int_equal(count_entries(cache, ".lock"), 1);
  free(again);
  free(first);
}

static void test_unusable_cache(void **state) {
  (void)state;
  char hf[512], blocker[512], cache[600];
  snprintf(hf, sizeof hf, "%s/tiny-hf2", root);
  mpk_import_options o;
  mpk_import_options_init(&o);
  if (mpk_synth("tiny", 2, SERVD_F32, hf, NULL, &o) != 0) fail_msg("mpk_synth: %s", servd_last_error());
  /* A file where a folder should be: fails for root as well as for anyone else. */
  snprintf(blocker, sizeof blocker, "%s/a-file", root);
  write_file(blocker, "x", 1);
  snprintf(cache, sizeof cache, "%s/packages", blocker);
  char *out = NULL;
  assert_int_equal(servd_package_cache_resolve(cache, hf, &out), SERVD_EINVAL);
  assert_null(out);
  const char *e = servd_last_error();
  assert_non_null(strstr(e, cache));
  assert_non_null(strstr(e, "--package-cache"));
  assert_non_null(strstr(e, "modelpkg pack"));
}

static int rm_tree(const char *path) {
  char cmd[600];
  snprintf(cmd, sizeof cmd, "rm -rf '%s'", path);
  return system(cmd);
}

int main(void) {
  snprintf(root, sizeof root, "/tmp/servd-pkgcache-XXXXXX");
  if (!mkdtemp(root)) return 1;
  const struct CMUnitTest tests[] = {
      cmocka_unit_test(test_detect),
      cmocka_unit_test(test_default_dir),
      cmocka_unit_test(test_package_passes_through),
      cmocka_unit_test(test_hf_build_reuse_rebuild),
      cmocka_unit_test(test_unusable_cache),
  };
  int rc = cmocka_run_group_tests(tests, NULL, NULL);
  rm_tree(root);
  return rc;
}
