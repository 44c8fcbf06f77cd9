/* Optional run-time components servd serves without, reported once at startup: what is missing, what
 * it disables and the command that installs it. */
#ifndef SERVD_COMPONENTS_H
#define SERVD_COMPONENTS_H

#include <stdio.h>

/* Writes one line per optional component to log: found (where, which version) or not installed. */
void servd_components_report(FILE *log);

/* The folder holding llguidance's dist-info among dirs (n of them, NULL entries skipped), or NULL;
 * *version gets the installed version ("" when the folder has no dist-info). For the tests. */
const char *servd_components_find_llguidance(const char *const *dirs, int n, char *version, size_t cap);

#endif
