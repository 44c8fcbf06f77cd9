/* A model's LoRA adapters: see lora_registry.h. */
#include "engine/lora_registry.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

int lora_registry_init(lora_registry *g, mpk_package *pkg, int max_loras, const char *refuse) {
  memset(g, 0, sizeof *g);
  pthread_mutex_init(&g->mu, NULL);
  g->pkg = pkg;
  g->max_loras = max_loras < 1 ? 1 : max_loras;
  g->next_id = 1;
  if (refuse) snprintf(g->base_err, sizeof g->base_err, "%s", refuse);
  else if (mpk_lora_base_of(pkg, &g->base) != 0) snprintf(g->base_err, sizeof g->base_err, "%s", servd_last_error());
  return 0;
}

static void adapter_free(lora_adapter *a) {
  if (!a) return;
  mpk_lora_free(a->w);
  free(a->name);
  free(a->path);
  free(a);
}

void lora_registry_free(lora_registry *g) {
  if (!g->max_loras) return;
  for (lora_adapter *a = g->head, *n; a; a = n) {
    n = a->next;
    adapter_free(a);
  }
  g->head = NULL;
  pthread_mutex_destroy(&g->mu);
  g->max_loras = 0;
}

static lora_adapter *find(lora_registry *g, const char *name) {
  for (lora_adapter *a = g->head; a; a = a->next)
    if (!a->removed && !strcmp(a->name, name)) return a;
  return NULL;
}

static int n_resident(const lora_registry *g) {
  int n = 0;
  for (const lora_adapter *a = g->head; a; a = a->next) n += a->w != NULL;
  return n;
}

/* Frees the least recently used resident adapter nobody holds; false when every one is held. */
static bool evict_one(lora_registry *g, const lora_adapter *keep) {
  lora_adapter *lru = NULL;
  for (lora_adapter *a = g->head; a; a = a->next)
    if (a != keep && a->w && a->users == 0 && (!lru || a->last_used < lru->last_used)) lru = a;
  if (!lru) return false;
  mpk_lora_free(lru->w);
  lru->w = NULL;
  lru->group.ab = NULL;
  g->evictions++;
  return true;
}

static void set_weights(lora_adapter *a, mpk_lora *w) {
  a->w = w;
  a->group = (servd_lora_group){.id = a->id, .scale = w->scale, .n_layers = w->n_layers, .ab = w->ab};
}

/* The content hash's first 64 bits: one adapter read twice keys the same cached blocks. */
static uint64_t key_of_hash(const char *h) {
  const char *hex = strchr(h, ':');
  return hex ? strtoull(hex + 1 + 48, NULL, 16) | 1 : 1;
}

static int read_weights(lora_registry *g, const char *path, mpk_lora **w) {
  if (g->base_err[0]) return servd_fail(SERVD_EUNSUPPORTED, "LoRA adapter %s: %s", path, g->base_err);
  int rc = mpk_lora_load(path, &g->base, w);
  if (rc == 0) g->loads++;
  return rc;
}

int lora_register(lora_registry *g, const char *name, const char *path) {
  if (!name || !name[0] || strlen(name) >= 128 || !path || !path[0])
    return servd_fail(SERVD_EINVAL, "LoRA adapter: expected a name (1 to 127 bytes) and a path");
  pthread_mutex_lock(&g->mu);
  int rc = 0;
  mpk_lora *w = NULL;
  lora_adapter *a = NULL;
  if (find(g, name)) {
    rc = servd_fail(SERVD_EINVAL, "LoRA adapter %s: the name is taken (unload it first)", name);
    goto out;
  }
  /* read outside no lock would let two loads of one name race; adapters are small and loads rare */
  if ((rc = read_weights(g, path, &w))) goto out;
  if (!(a = calloc(1, sizeof *a)) || !(a->name = strdup(name)) || !(a->path = strdup(path))) {
    rc = servd_fail(SERVD_ENOMEM, "LoRA adapter %s", name);
    adapter_free(a);
    mpk_lora_free(w);
    goto out;
  }
  a->id = g->next_id++;
  a->key = key_of_hash(w->content_hash);
  a->last_used = ++g->clock;
  set_weights(a, w);
  while (n_resident(g) >= g->max_loras && evict_one(g, NULL)) {}
  if (n_resident(g) >= g->max_loras) { /* every slot held: registered, read again on first use */
    mpk_lora_free(a->w);
    a->w = NULL;
    a->group.ab = NULL;
  }
  a->next = g->head;
  g->head = a;
out:
  pthread_mutex_unlock(&g->mu);
  return rc;
}

int lora_unregister(lora_registry *g, const char *name) {
  pthread_mutex_lock(&g->mu);
  lora_adapter **pp = &g->head;
  while (*pp && ((*pp)->removed || strcmp((*pp)->name, name))) pp = &(*pp)->next;
  lora_adapter *a = *pp;
  int rc = 0;
  if (!a) rc = servd_fail(SERVD_EINVAL, "LoRA adapter %s: no adapter of that name is loaded", name);
  else if (a->users > 0) a->removed = true;
  else {
    *pp = a->next;
    adapter_free(a);
  }
  pthread_mutex_unlock(&g->mu);
  return rc;
}

int lora_acquire(lora_registry *g, const char *name, lora_adapter **out) {
  *out = NULL;
  pthread_mutex_lock(&g->mu);
  int rc = 0;
  lora_adapter *a = find(g, name);
  if (!a) {
    rc = servd_fail(SERVD_EINVAL, "model: no model or LoRA adapter is named '%s'", name);
    goto out;
  }
  if (!a->w) {
    while (n_resident(g) >= g->max_loras && evict_one(g, a)) {}
    if (n_resident(g) >= g->max_loras) {
      rc = servd_fail(SERVD_EBUSY, "LoRA adapter %s: all %d resident adapters are in use (--max-loras); try again",
                      name, g->max_loras);
      goto out;
    }
    mpk_lora *w;
    if ((rc = read_weights(g, a->path, &w))) goto out;
    set_weights(a, w);
  }
  a->users++;
  a->last_used = ++g->clock;
  *out = a;
out:
  pthread_mutex_unlock(&g->mu);
  return rc;
}

void lora_release(lora_registry *g, lora_adapter *a) {
  if (!a) return;
  pthread_mutex_lock(&g->mu);
  a->users--;
  if (a->removed && a->users == 0) {
    lora_adapter **pp = &g->head;
    while (*pp && *pp != a) pp = &(*pp)->next;
    if (*pp) *pp = a->next;
    adapter_free(a);
  }
  pthread_mutex_unlock(&g->mu);
}

bool lora_known(lora_registry *g, const char *name) {
  if (!g->max_loras) return false;
  pthread_mutex_lock(&g->mu);
  bool k = find(g, name) != NULL;
  pthread_mutex_unlock(&g->mu);
  return k;
}

int lora_list(lora_registry *g, servd_lora_info *out, int cap) {
  if (!g->max_loras) return 0;
  pthread_mutex_lock(&g->mu);
  int n = 0;
  for (lora_adapter *a = g->head; a; a = a->next) {
    if (a->removed) continue;
    if (n < cap) {
      servd_lora_info *i = &out[n];
      memset(i, 0, sizeof *i);
      snprintf(i->name, sizeof i->name, "%s", a->name);
      snprintf(i->path, sizeof i->path, "%s", a->path);
      i->id = a->id;
      i->resident = a->w != NULL;
      i->users = a->users;
      i->running = a->running;
      if (a->w) {
        i->rank = a->w->rank;
        i->scale = a->w->scale;
        i->bytes = a->w->bytes;
      }
    }
    n++;
  }
  pthread_mutex_unlock(&g->mu);
  return n;
}
