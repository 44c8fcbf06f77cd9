/* servd: the model-serving daemon. `servd [serve] ...` runs the server; `servd generate ...` runs a
 * model from the command line. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "crash_report.h"
#include "engine/isolated.h"
#include "serve.h"

#if __has_include("generate.h")
#include "generate.h"
#define SERVD_HAVE_GENERATE 1
#endif
#if __has_include("servd/interp.h")
#include "servd/interp.h"
#define SERVD_HAVE_INTERP 1
#endif

int main(int argc, char **argv) {
#ifdef SERVD_HAVE_INTERP
  /* May re-execute the process with the glibc tunables that many interpreters need. */
  if (servd_interp_early_init(argc, argv) != 0)
    fprintf(stderr, "servd: warning: interpreter setup: %s\n", servd_last_error());
#endif
  /* Before any thread or NCCL communicator exists (setenv is not safe beside other threads): NCCL's
   * graph registration would have every rank wait for handshakes with a rank whose CUDA graph capture
   * failed. The device layer sets it too; an operator's own setting wins. */
  setenv("NCCL_GRAPH_REGISTER", "0", 0);
  /* Load every CUDA kernel when a context is created (at startup, see serve.c), not lazily at a
   * first launch that may come from inside an interpreter's call or a graph capture. */
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  servd_crash_report_install();
  int code;
  if (argc > 1 && strcmp(argv[1], "isolated-worker") == 0) {
    code = servd_isolated_worker_main(argc - 1, argv + 1); /* a model's own process (engine/isolated.h) */
  } else if (argc > 1 && strcmp(argv[1], "generate") == 0) {
#ifdef SERVD_HAVE_GENERATE
    code = servd_generate_main(argc - 1, argv + 1);
#else
    fprintf(stderr, "servd: 'generate' is not built into this servd\n");
    code = 2;
#endif
  } else {
    code = servd_serve_main(argc, argv);
  }
  /* Interpreters loaded into their own namespaces must not run library destructors at exit. */
  fflush(NULL);
  _exit(code);
}
