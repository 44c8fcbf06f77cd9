/* A model's LoRA adapters (internal to the engine): registered by name (servd --lora, POST
 * /v1/load_lora_adapter), checked against the base when registered, held by the requests that use
 * them, and at most max_loras resident: loading one more evicts the least recently used adapter that
 * no request holds (its weights are read again from its path when a request next asks for it).
 *
 * Thread-safe (one mutex): requests acquire on the submitting thread and release when they end;
 * the step reads the weights of the adapters its sequences hold, which nothing evicts or frees while
 * held. An adapter unregistered while held is freed by its last release.
 */
#ifndef SERVD_ENGINE_LORA_REGISTRY_H
#define SERVD_ENGINE_LORA_REGISTRY_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "engine/types.h"
#include "mpk/lora.h"
#include "servd/interp.h"

typedef struct lora_adapter {
  char *name, *path;
  int64_t id;             /* registration number, never reused: the forward's group id */
  uint64_t key;           /* the prefix-cache key of its sequences' blocks (from its content hash) */
  mpk_lora *w;            /* resident weights, or NULL (evicted) */
  servd_lora_group group; /* the forward's view of w (ab, scale, layers) */
  int users;              /* requests holding it */
  int running;            /* of those, sequences in the step just planned */
  uint64_t last_used;     /* LRU clock */
  bool removed;           /* unregistered while held: freed by the last release */
  struct lora_adapter *next;
} lora_adapter;

typedef struct lora_registry {
  pthread_mutex_t mu;
  mpk_package *pkg; /* the base, borrowed */
  mpk_lora_base base;
  char base_err[512]; /* non-empty: the base takes no adapters, and why */
  int max_loras;
  lora_adapter *head;
  int64_t next_id;
  uint64_t clock;
  uint64_t loads, evictions; /* counters */
  /* engine_lora.c: whether the package's model code applies adapters, asked once */
  bool code_checked;
  int code_rc;
  char code_err[512];
} lora_registry;

/* max_loras >= 1. refuse (NULL: none) says why this model takes no adapters (tensor parallelism,
 * GPUs), checked at registration. */
int lora_registry_init(lora_registry *g, mpk_package *pkg, int max_loras, const char *refuse);
void lora_registry_free(lora_registry *g); /* accepts a zeroed struct; no adapter may be held */

/* Registers name for the adapter at path, read and checked now (it stays resident if a slot is free
 * or can be freed). SERVD_EINVAL when the name is taken, the adapter's own error otherwise. */
int lora_register(lora_registry *g, const char *name, const char *path);
/* SERVD_EINVAL when no adapter has that name; a held adapter is freed by its last release. */
int lora_unregister(lora_registry *g, const char *name);
/* The adapter named name, resident (read again if evicted) and held until lora_release:
 * SERVD_EINVAL for an unknown name, SERVD_EBUSY when every resident slot is held by requests. */
int lora_acquire(lora_registry *g, const char *name, lora_adapter **out);
void lora_release(lora_registry *g, lora_adapter *a); /* accepts NULL */
/* Whether name is a registered adapter. */
bool lora_known(lora_registry *g, const char *name);

/* Up to cap adapters' information (names copied); returns how many there are. */
int lora_list(lora_registry *g, servd_lora_info *out, int cap);

#endif
