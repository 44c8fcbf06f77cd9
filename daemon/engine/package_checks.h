/* What the engine checks in a package before it serves it (hashes, signature: mpk/integrity.h),
 * and the line it logs once a model is loaded. Internal to the engine. */
#ifndef SERVD_ENGINE_PACKAGE_CHECKS_H
#define SERVD_ENGINE_PACKAGE_CHECKS_H

#include <stddef.h>

#include "engine/types.h"

/* Sets o's verify_weights and trusted_keys from the process-wide defaults
 * (servd_engine_set_package_checks). */
void servd__package_checks_default(servd_model_options *o);

/* On m->pkg as just opened: the signature when m->o.trusted_keys is set, the hashes of the code and
 * small entries, and of the weights when m->o.verify_weights. `report` receives what was checked. */
int servd__model_check_package(servd_model *m, char *report, size_t report_len);

/* "servd: model 'NAME': loaded in S s: package ... ; KV cache ...; integrity: report" on stderr. */
void servd__model_log_loaded(const servd_model *m, int64_t started_ns, const char *report);

#endif
