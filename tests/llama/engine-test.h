/* Shared start of the engine tests: every test executable re-executes itself for the interpreter
 * namespaces, sizes the compute pool to 2 threads and works in a scratch folder of its own. */
#ifndef SERVD_ENGINE_TEST_H
#define SERVD_ENGINE_TEST_H

#include <stdio.h>
#include <stdlib.h>

#include "mpk/import.h"
#include "servd/interp.h"
#include "servd/threadpool.h"

/* Fills tmpdir (cap bytes) with a new /tmp/servd-test-NAME.XXXXXX folder; 0 or -1. */
static inline int engine_test_start(int argc, char **argv, const char *name, char *tmpdir, size_t cap) {
  if (servd_interp_early_init(argc, argv)) return -1;
  servd_threadpool_init(2);
  snprintf(tmpdir, cap, "/tmp/servd-test-%s.XXXXXX", name);
  return mkdtemp(tmpdir) ? 0 : -1;
}

/* Synthesizes the tiny Llama (seed 11, f32) as tmpdir/FILE into pkg (cap bytes); io may be NULL. */
static inline int engine_test_synth_tiny(const char *tmpdir, const char *file, char *pkg, size_t cap,
                                         const mpk_import_options *io) {
  snprintf(pkg, cap, "%s/%s", tmpdir, file);
  if (mpk_synth("tiny", 11, SERVD_F32, NULL, pkg, io)) {
    fprintf(stderr, "synth: %s\n", servd_last_error());
    return -1;
  }
  return 0;
}

#endif
