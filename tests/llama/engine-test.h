/* Shared start of the engine tests: every test executable re-executes itself for the interpreter
 * namespaces, sizes the compute pool to 2 threads and works in a scratch folder of its own. */
#ifndef SERVD_ENGINE_TEST_H
#define SERVD_ENGINE_TEST_H

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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

/* Copies the project's model code to tmpdir/llama (into code_dir, cap bytes, which must outlive io),
 * adds faulty_py there as faulty.py and points io at its class Faulty; 0 or -1. */
static inline int engine_test_faulty_code(const char *tmpdir, const char *faulty_py, char *code_dir, size_t cap,
                                          mpk_import_options *io) {
  char cmd[1024], path[512];
  snprintf(code_dir, cap, "%s/llama", tmpdir);
  snprintf(cmd, sizeof cmd, "cp -r '%s' '%s' && rm -rf '%s/__pycache__'", mpk_default_code_dir(), code_dir, code_dir);
  if (system(cmd) != 0) {
    fprintf(stderr, "copying the model code from %s failed\n", mpk_default_code_dir());
    return -1;
  }
  snprintf(path, sizeof path, "%s/faulty.py", code_dir);
  FILE *f = fopen(path, "w");
  size_t n = strlen(faulty_py);
  if (!f || fwrite(faulty_py, 1, n, f) != n || fclose(f)) return -1;
  mpk_import_options_init(io);
  io->code_dir = code_dir;
  io->entry_point = "llama.faulty:Faulty";
  return 0;
}

#endif
