#include "trust.h"

#include <stdio.h>

#include "mpk/integrity.h"

int servd_check_trusted_keys(const char *path) {
  mpk_keyring *k;
  if (mpk_keyring_load(path, &k)) {
    fprintf(stderr, "servd: --trusted-keys: %s\n", servd_last_error());
    return 2;
  }
  int n = mpk_keyring_count(k);
  fprintf(stderr, "servd: trusted keys: %d in %s; only packages signed by one of them load\n", n, path);
  mpk_keyring_free(k);
  return 0;
}
