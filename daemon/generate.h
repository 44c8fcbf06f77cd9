/* `servd generate`: one-shot generation from the command line (streams text to stdout, reports
 * prefill and decode speed on stderr). */
#ifndef SERVD_GENERATE_H
#define SERVD_GENERATE_H

/* argv[0] is the program or the word "generate"; returns the process exit status. */
int servd_generate_main(int argc, char **argv);

#endif
