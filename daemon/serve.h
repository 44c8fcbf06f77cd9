/* `servd [serve]`: runs the HTTP server until SIGTERM/SIGINT, then drains and exits 0. */
#ifndef SERVD_SERVE_H
#define SERVD_SERVE_H

#include <stddef.h>

/* Returns the process exit status: 0 after a clean drain, 1 on a startup failure (a model failed to
 * load, the port is taken), 2 on a usage or configuration error. */
int servd_serve_main(int argc, char **argv);

#endif
