/* KV-cache events over ZeroMQ in vLLM's format: see kv_events.h. */
#include "engine/kv_events.h"

#include <errno.h>
#include <msgpack.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>
#include <zmq.h>

#include "engine/kv_block_hash.h"
#include "engine/prefix_cache.h"
#include "servd/status.h"

enum { EV_STORED, EV_REMOVED, EV_CLEARED };

/* One queued event; a stored block's tokens follow it in the ring. */
typedef struct ev_slot {
  uint8_t kind;
  bool has_parent;
  uint64_t hash, parent;
} ev_slot;

struct kv_events_source {
  struct kv_events_source *next;
  servd_kv_events *pub;
  char *topic;
  const char *medium;
  int block_size, n_blocks;
  uint64_t *ext;  /* per block id: its llm-d hash (the scheduler thread's) */
  uint8_t *known; /* per block id: stored and not removed since */
  char *ring;     /* cap slots of stride bytes */
  size_t stride;
  uint64_t cap;
  _Atomic uint64_t head, tail; /* consumed by the publisher / produced by the scheduler thread */
  _Atomic uint64_t queued, dropped;
  _Atomic bool detached;
};

typedef struct replay_entry {
  uint64_t seq;
  void *data;
  size_t len;
} replay_entry;

struct servd_kv_events {
  void *ctx, *pub, *router;
  int efd;
  pthread_t thread;
  bool started;
  _Atomic bool stop;
  pthread_mutex_t mu; /* sources */
  kv_events_source *sources;
  char *topic_fmt;
  uint64_t root;
  int queue_events;
  uint64_t seq; /* the next batch's; the publisher thread's */
  replay_entry *replay;
  int replay_cap, replay_n, replay_at; /* a ring of the latest batches, oldest at replay_at */
};

/* ---- the scheduler thread's side ------------------------------------------------------------- */

static void wake(servd_kv_events *e) {
  uint64_t one = 1;
  ssize_t w = write(e->efd, &one, sizeof one); /* a full counter already wakes the publisher */
  (void)w;
}

/* The next free slot, or NULL (counted) when the ring is full. */
static ev_slot *slot_take(kv_events_source *s) {
  uint64_t t = atomic_load_explicit(&s->tail, memory_order_relaxed);
  uint64_t h = atomic_load_explicit(&s->head, memory_order_acquire);
  if (t - h >= s->cap) {
    atomic_fetch_add_explicit(&s->dropped, 1, memory_order_relaxed);
    return NULL;
  }
  return (ev_slot *)(s->ring + (t % s->cap) * s->stride);
}

static void slot_put(kv_events_source *s) {
  uint64_t t = atomic_load_explicit(&s->tail, memory_order_relaxed);
  uint64_t h = atomic_load_explicit(&s->head, memory_order_acquire);
  atomic_store_explicit(&s->tail, t + 1, memory_order_release);
  atomic_fetch_add_explicit(&s->queued, 1, memory_order_relaxed);
  if (t == h) wake(s->pub); /* the ring was empty: the publisher may be waiting */
}

static void on_stored(void *ud, int32_t id, int32_t parent, const int32_t *tokens, int block_size) {
  kv_events_source *s = ud;
  if (id < 0 || id >= s->n_blocks || block_size != s->block_size) return;
  if (parent >= 0 && (parent >= s->n_blocks || !s->known[parent])) return; /* a chain nobody heard of */
  uint64_t h = kv_block_hash(parent >= 0 ? s->ext[parent] : s->pub->root, tokens, block_size);
  s->ext[id] = h;
  s->known[id] = 1;
  ev_slot *e = slot_take(s);
  if (!e) return;
  *e = (ev_slot){.kind = EV_STORED, .has_parent = parent >= 0, .hash = h, .parent = parent >= 0 ? s->ext[parent] : 0};
  memcpy(e + 1, tokens, (size_t)block_size * sizeof *tokens);
  slot_put(s);
}

static void on_removed(void *ud, int32_t id) {
  kv_events_source *s = ud;
  if (id < 0 || id >= s->n_blocks || !s->known[id]) return;
  s->known[id] = 0;
  ev_slot *e = slot_take(s);
  if (!e) return;
  *e = (ev_slot){.kind = EV_REMOVED, .hash = s->ext[id]};
  slot_put(s);
}

static void push_cleared(kv_events_source *s) {
  memset(s->known, 0, (size_t)s->n_blocks);
  ev_slot *e = slot_take(s);
  if (!e) return;
  *e = (ev_slot){.kind = EV_CLEARED};
  slot_put(s);
}

static const prefix_cache_events hooks = {on_stored, on_removed};

/* ---- the publisher thread ------------------------------------------------------------------- */

static void pack_str(msgpack_packer *pk, const char *s) {
  size_t n = strlen(s);
  msgpack_pack_str(pk, n);
  msgpack_pack_str_body(pk, s, n);
}

static void replay_keep(servd_kv_events *e, uint64_t seq, const char *data, size_t len) {
  void *copy = malloc(len);
  if (!copy) return; /* a gap in what replay can give, nothing more */
  memcpy(copy, data, len);
  int at;
  if (e->replay_n < e->replay_cap) at = (e->replay_at + e->replay_n++) % e->replay_cap;
  else {
    at = e->replay_at;
    free(e->replay[at].data);
    e->replay_at = (e->replay_at + 1) % e->replay_cap;
  }
  e->replay[at] = (replay_entry){seq, copy, len};
}

static void seq_bytes(uint64_t v, uint8_t out[8]) {
  for (int i = 0; i < 8; i++) out[i] = (uint8_t)(v >> (56 - 8 * i));
}

/* Sends what s's ring holds as one batch (at most 4096 events; the rest in the next). */
static void publish_source(servd_kv_events *e, kv_events_source *s, msgpack_sbuffer *sb) {
  uint64_t h = atomic_load_explicit(&s->head, memory_order_relaxed);
  uint64_t t = atomic_load_explicit(&s->tail, memory_order_acquire);
  while (h != t) {
    uint64_t n = t - h > 4096 ? 4096 : t - h;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    msgpack_sbuffer_clear(sb);
    msgpack_packer pk;
    msgpack_packer_init(&pk, sb, msgpack_sbuffer_write);
    msgpack_pack_array(&pk, 2);
    msgpack_pack_double(&pk, (double)ts.tv_sec + ts.tv_nsec / 1e9);
    msgpack_pack_array(&pk, (size_t)n);
    for (uint64_t i = 0; i < n; i++) {
      const ev_slot *ev = (const ev_slot *)(s->ring + ((h + i) % s->cap) * s->stride);
      if (ev->kind == EV_STORED) {
        const int32_t *tok = (const int32_t *)(ev + 1);
        msgpack_pack_array(&pk, 7);
        pack_str(&pk, "BlockStored");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint64(&pk, ev->hash);
        if (ev->has_parent) msgpack_pack_uint64(&pk, ev->parent);
        else msgpack_pack_nil(&pk);
        msgpack_pack_array(&pk, (size_t)s->block_size);
        for (int k = 0; k < s->block_size; k++) msgpack_pack_int32(&pk, tok[k]);
        msgpack_pack_int(&pk, s->block_size);
        msgpack_pack_nil(&pk); /* lora_id */
        pack_str(&pk, s->medium);
      } else if (ev->kind == EV_REMOVED) {
        msgpack_pack_array(&pk, 3);
        pack_str(&pk, "BlockRemoved");
        msgpack_pack_array(&pk, 1);
        msgpack_pack_uint64(&pk, ev->hash);
        pack_str(&pk, s->medium);
      } else {
        msgpack_pack_array(&pk, 1);
        pack_str(&pk, "AllBlocksCleared");
      }
    }
    h += n;
    atomic_store_explicit(&s->head, h, memory_order_release);
    uint8_t seq[8];
    seq_bytes(e->seq, seq);
    /* Reading ZMQ_EVENTS makes the socket take in the subscriptions its peers sent since the last
     * batch, so this one is filtered against them (a new subscriber's first batch is not lost). */
    int events;
    size_t events_len = sizeof events;
    zmq_getsockopt(e->pub, ZMQ_EVENTS, &events, &events_len);
    zmq_send(e->pub, s->topic, strlen(s->topic), ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(e->pub, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(e->pub, sb->data, sb->size, ZMQ_DONTWAIT);
    replay_keep(e, e->seq, sb->data, sb->size);
    e->seq++;
  }
}

static void source_free(kv_events_source *s) {
  if (!s) return;
  free(s->topic);
  free(s->ext);
  free(s->known);
  free(s->ring);
  free(s);
}

static void publish_all(servd_kv_events *e, msgpack_sbuffer *sb) {
  pthread_mutex_lock(&e->mu);
  for (kv_events_source **at = &e->sources; *at;) {
    kv_events_source *s = *at;
    bool gone = atomic_load_explicit(&s->detached, memory_order_acquire);
    publish_source(e, s, sb);
    if (gone) {
      *at = s->next;
      source_free(s);
    } else {
      at = &s->next;
    }
  }
  pthread_mutex_unlock(&e->mu);
}

/* A replay request: [identity, (empty,) start seq]. Answers every buffered batch from start on,
 * then the end marker, each as [identity, empty, seq, payload] (the empty frame for REQ clients). */
static void serve_replay(servd_kv_events *e) {
  zmq_msg_t parts[4];
  int n = 0, more = 1;
  while (more) {
    zmq_msg_t m;
    zmq_msg_init(&m);
    if (zmq_msg_recv(&m, e->router, ZMQ_DONTWAIT) < 0) {
      zmq_msg_close(&m);
      break;
    }
    more = zmq_msg_more(&m);
    if (n < 4) parts[n++] = m;
    else zmq_msg_close(&m);
  }
  if (n >= 2 && zmq_msg_size(&parts[n - 1]) == 8) {
    const uint8_t *p = zmq_msg_data(&parts[n - 1]);
    uint64_t start = 0;
    for (int i = 0; i < 8; i++) start = start << 8 | p[i];
    const void *id = zmq_msg_data(&parts[0]);
    size_t id_len = zmq_msg_size(&parts[0]);
    for (int k = 0; k < e->replay_n; k++) {
      const replay_entry *r = &e->replay[(e->replay_at + k) % e->replay_cap];
      if (r->seq < start) continue;
      uint8_t seq[8];
      seq_bytes(r->seq, seq);
      zmq_send(e->router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(e->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(e->router, seq, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
      zmq_send(e->router, r->data, r->len, ZMQ_DONTWAIT);
    }
    static const uint8_t end[8] = {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}; /* -1 */
    zmq_send(e->router, id, id_len, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(e->router, "", 0, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(e->router, end, 8, ZMQ_SNDMORE | ZMQ_DONTWAIT);
    zmq_send(e->router, "", 0, ZMQ_DONTWAIT);
  }
  for (int i = 0; i < n; i++) zmq_msg_close(&parts[i]);
}

static void *publisher_main(void *arg) {
  servd_kv_events *e = arg;
  pthread_setname_np(pthread_self(), "servd-kvevents");
  msgpack_sbuffer sb;
  msgpack_sbuffer_init(&sb);
  while (!atomic_load(&e->stop)) {
    zmq_pollitem_t items[2] = {{.fd = e->efd, .events = ZMQ_POLLIN}, {.socket = e->router, .events = ZMQ_POLLIN}};
    /* The timeout catches an event pushed while this thread was draining its ring (no wake then). */
    zmq_poll(items, e->router ? 2 : 1, 50);
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t v;
      ssize_t r = read(e->efd, &v, sizeof v);
      (void)r;
    }
    publish_all(e, &sb); /* first: a replay request sees every event queued before it arrived */
    if (e->router && (items[1].revents & ZMQ_POLLIN)) serve_replay(e);
  }
  publish_all(e, &sb);
  msgpack_sbuffer_destroy(&sb);
  return NULL;
}

static servd_kv_events *process_default;
void servd_engine_set_kv_events(servd_kv_events *e) { process_default = e; }
servd_kv_events *servd_kv_events_default(void) { return process_default; }

/* ---- life cycle ----------------------------------------------------------------------------- */

/* vLLM's rule: an endpoint with a wildcard address ("*", "::") or a local transport is bound (the
 * subscribers connect to this replica); any other is connected to (a subscriber that binds, as
 * llm-d's endpoint picker does, and every replica connects to it). The replay socket always binds. */
static bool binds(const char *endpoint) {
  return strchr(endpoint, '*') || strstr(endpoint, "::") || !strncmp(endpoint, "ipc://", 6) ||
         !strncmp(endpoint, "inproc://", 9);
}

static int open_socket(void *ctx, int type, const char *endpoint, bool bind, const char *flag, void **out) {
  *out = zmq_socket(ctx, type);
  if (!*out) return servd_fail(SERVD_ENOMEM, "%s %s: socket: %s", flag, endpoint, zmq_strerror(zmq_errno()));
  int linger = 200; /* ms: what is queued at exit still goes out, for a moment */
  zmq_setsockopt(*out, ZMQ_LINGER, &linger, sizeof linger);
  if ((bind ? zmq_bind(*out, endpoint) : zmq_connect(*out, endpoint)) != 0)
    return servd_fail(SERVD_EINVAL, "%s %s: cannot %s: %s (expected tcp://HOST:PORT, ipc://PATH, ...)", flag, endpoint,
                      bind ? "bind" : "connect", zmq_strerror(zmq_errno()));
  return 0;
}

int servd_kv_events_create(const servd_kv_events_options *o, servd_kv_events **out) {
  *out = NULL;
  if (!o || !o->endpoint || !*o->endpoint) return servd_fail(SERVD_EINVAL, "--kv-events-endpoint: empty");
  servd_kv_events *e = calloc(1, sizeof *e);
  if (!e) return servd_fail(SERVD_ENOMEM, "kv events");
  e->efd = -1;
  pthread_mutex_init(&e->mu, NULL);
  int rc = 0;
  const char *seed = o->hash_seed ? o->hash_seed : getenv("PYTHONHASHSEED");
  e->root = kv_block_hash_root(seed);
  e->queue_events = o->queue_events > 0 ? o->queue_events : 8192;
  e->replay_cap = o->replay_batches > 0 ? o->replay_batches : 1024;
  e->topic_fmt = strdup(o->topic ? o->topic : "kv@{host}@{model}");
  e->replay = calloc((size_t)e->replay_cap, sizeof *e->replay);
  e->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  e->ctx = zmq_ctx_new();
  if (!e->topic_fmt || !e->replay || e->efd < 0 || !e->ctx) {
    rc = servd_fail(SERVD_ENOMEM, "kv events: publisher state (%s)", strerror(errno));
    goto fail;
  }
  if ((rc = open_socket(e->ctx, ZMQ_PUB, o->endpoint, binds(o->endpoint), "--kv-events-endpoint", &e->pub))) goto fail;
  if (o->replay_endpoint &&
      (rc = open_socket(e->ctx, ZMQ_ROUTER, o->replay_endpoint, true, "--kv-events-replay-endpoint", &e->router)))
    goto fail;
  if (pthread_create(&e->thread, NULL, publisher_main, e)) {
    rc = servd_fail(SERVD_ENOMEM, "kv events: starting the publisher thread");
    goto fail;
  }
  e->started = true;
  *out = e;
  return 0;
fail:
  servd_kv_events_destroy(e);
  return rc;
}

void servd_kv_events_destroy(servd_kv_events *e) {
  if (!e) return;
  if (e->started) {
    atomic_store(&e->stop, true);
    wake(e);
    pthread_join(e->thread, NULL);
  }
  while (e->sources) {
    kv_events_source *s = e->sources;
    e->sources = s->next;
    source_free(s);
  }
  if (e->pub) zmq_close(e->pub);
  if (e->router) zmq_close(e->router);
  if (e->ctx) zmq_ctx_term(e->ctx);
  if (e->efd >= 0) close(e->efd);
  for (int k = 0; k < e->replay_n; k++) free(e->replay[(e->replay_at + k) % e->replay_cap].data);
  free(e->replay);
  free(e->topic_fmt);
  pthread_mutex_destroy(&e->mu);
  free(e);
}

/* The topic format with {model} and {host} replaced. */
static char *topic_of(const char *fmt, const char *model) {
  char host[256] = "";
  const char *ip = getenv("POD_IP");
  if (ip && *ip) snprintf(host, sizeof host, "%s", ip);
  else if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost");
  size_t cap = strlen(fmt) + 1;
  for (const char *p = fmt; (p = strchr(p, '{')); p++) cap += strlen(model) + strlen(host);
  char *out = malloc(cap), *w = out;
  if (!out) return NULL;
  for (const char *p = fmt; *p;) {
    if (!strncmp(p, "{model}", 7)) {
      w = stpcpy(w, model);
      p += 7;
    } else if (!strncmp(p, "{host}", 6)) {
      w = stpcpy(w, host);
      p += 6;
    } else {
      *w++ = *p++;
    }
  }
  *w = 0;
  return out;
}

int servd_kv_events_attach(servd_kv_events *e, servd_prefix_cache *pc, const char *model, bool gpu,
                           kv_events_source **out) {
  *out = NULL;
  if (!e || !pc->enabled) return 0; /* no prefix cache: no blocks to tell of */
  kv_events_source *s = calloc(1, sizeof *s);
  if (!s) return servd_fail(SERVD_ENOMEM, "kv events: model %s", model);
  s->pub = e;
  s->medium = gpu ? "GPU" : "CPU";
  s->block_size = pc->block_size;
  s->n_blocks = pc->n_blocks;
  s->stride = (sizeof(ev_slot) + (size_t)s->block_size * sizeof(int32_t) + 7) & ~(size_t)7;
  s->cap = (uint64_t)e->queue_events;
  s->topic = topic_of(e->topic_fmt, model);
  s->ext = calloc((size_t)s->n_blocks, sizeof *s->ext);
  s->known = calloc((size_t)s->n_blocks, 1);
  s->ring = malloc(s->cap * s->stride);
  if (!s->topic || !s->ext || !s->known || !s->ring) {
    source_free(s);
    return servd_fail(SERVD_ENOMEM, "kv events: model %s: a queue of %d events", model, e->queue_events);
  }
  push_cleared(s); /* whatever a subscriber knew of an earlier process under this topic is gone */
  pthread_mutex_lock(&e->mu);
  s->next = e->sources;
  e->sources = s;
  pthread_mutex_unlock(&e->mu);
  pc->events = &hooks;
  pc->events_ud = s;
  *out = s;
  return 0;
}

void servd_kv_events_detach(kv_events_source *s, servd_prefix_cache *pc) {
  if (!s) return;
  if (pc && pc->events_ud == s) {
    pc->events = NULL;
    pc->events_ud = NULL;
  }
  push_cleared(s);
  atomic_store_explicit(&s->detached, true, memory_order_release); /* the publisher frees it */
  wake(s->pub);
}

void servd_kv_events_source_stats(const kv_events_source *s, uint64_t *queued, uint64_t *dropped) {
  kv_events_source *m = (kv_events_source *)s;
  *queued = s ? atomic_load(&m->queued) : 0;
  *dropped = s ? atomic_load(&m->dropped) : 0;
}
