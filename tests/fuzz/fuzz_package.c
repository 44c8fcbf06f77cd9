/* libFuzzer: the package opener (zip, manifest, tensor index) on a memory file, then verify, the
 * registry's model check and every tensor view. */
#include <stdint.h>
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "mpk/package.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  static int fd = -1;
  static char path[64];
  if (fd < 0) {
    fd = memfd_create("fuzz.mpk", 0);
    if (fd < 0) return 0;
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  }
  if (ftruncate(fd, 0) != 0 || pwrite(fd, data, size, 0) != (ssize_t)size) return 0;
  mpk_package *p = NULL;
  if (mpk_open(path, &p) != 0) return 0;
  mpk_verify(p);
  mpk_check_model(p);
  volatile uint8_t sink = 0;
  for (int i = 0; i < mpk_tensor_count(p); i++) {
    servd_tensor *t = NULL;
    if (mpk_tensor(p, mpk_tensor_name(p, i), &t) == 0) {
      size_t nb = servd_tensor_nbytes(t);
      if (nb) sink ^= ((const uint8_t *)servd_tensor_data(t))[nb - 1];
      servd_tensor_release(t);
    }
  }
  for (int i = 0; i < mpk_file_count(p); i++) {
    const void *d;
    size_t n;
    if (mpk_file(p, mpk_file_path(p, i), &d, &n) == 0 && n) sink ^= ((const uint8_t *)d)[n - 1];
  }
  (void)sink;
  mpk_close(p);
  return 0;
}
