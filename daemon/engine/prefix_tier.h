/* A model's prefix-cache disk tier (prefix_disk.h) from its options: opened on the scheduler's
 * thread once the scheduler exists, closed at unload, counted in the stats. Internal to the engine. */
#ifndef SERVD_ENGINE_PREFIX_TIER_H
#define SERVD_ENGINE_PREFIX_TIER_H

#include "engine/types.h"

/* With m->o.prefix_cache_dir set (and the prefix cache on, on the CPU): opens the tier and hands it
 * to the scheduler's block manager. A GPU model logs that the tier is not used. */
int servd__prefix_tier_open(servd_model *m);
void servd__prefix_tier_close(servd_model *m); /* writes what is queued; no tier: nothing */
void servd__prefix_tier_stats(const servd_model *m, servd_model_stats *s);

#endif
