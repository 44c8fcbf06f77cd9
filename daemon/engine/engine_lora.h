/* The engine's LoRA seams (internal to the engine): the default limit, a request's adapter at
 * submit, and the step's adapter groups. The adapters themselves are engine/lora_registry.h's. */
#ifndef SERVD_ENGINE_ENGINE_LORA_H
#define SERVD_ENGINE_ENGINE_LORA_H

#include "engine/engine_impl.h"

int servd__max_loras_default(void);
/* At load of a language model, before its scheduler runs. */
void servd__model_lora_init(servd_model *m);
/* Submit: r holds the adapter named name (NULL or "": none) and its blocks are keyed by it. */
int servd__request_lora(servd_model *m, servd_request *r, const char *name);
/* Plan: the batch's adapter groups (runs of consecutive sequences with one adapter) into groups
 * (capacity: the planned sequences), b->lora and b->n_lora pointing at them; each adapter's
 * running count set. */
void servd__plan_lora_groups(servd_model *m, servd_lora_group *groups, servd_forward_batch *b);

#endif
