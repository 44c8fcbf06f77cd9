/* KV-cache events: the prefix cache's blocks, stored and removed, published over ZeroMQ in vLLM's
 * wire format (vllm/distributed/kv_events.py), so that llm-d's KV-cache indexer (precise
 * prefix-cache routing) knows which replica holds which prompt prefix.
 *
 * Wire format. A PUB socket sends three frames per batch: the topic, the batch's sequence number
 * (8 bytes, big-endian, from 0, one sequence for every topic) and a msgpack array
 *   [ts (float64, unix seconds), [event, ...]]
 * where an event is a tagged array:
 *   ["BlockStored", [hash], parent_hash | nil, [token ids], block_size, lora_id (nil), medium]
 *   ["BlockRemoved", [hash], medium]
 *   ["AllBlocksCleared"]
 * Hashes are llm-d's (kv_block_hash.h), unsigned 64-bit; medium is "CPU" or "GPU" (where the
 * model's KV cache lives). A ROUTER socket (the replay endpoint, optional) answers a request whose
 * last frame is a start sequence number (8 bytes, big-endian) with [seq, payload] for every batch
 * still buffered from that number on, then [-1 (8 bytes), empty]: a subscriber that sees a gap
 * asks for what it missed.
 *
 * Threads. The hooks run on each model's scheduler thread and only copy the event into that model's
 * bounded ring (single producer, single consumer); a ring that is full drops the event and counts it
 * (a subscriber then sees a block it never hears of, which costs a routing decision, never a wrong
 * answer: servd compares block content on every hit). One publisher thread owns the sockets: it
 * drains the rings into one batch per model and wake-up, encodes, sends (a PUB socket never blocks:
 * a slow subscriber loses messages, not the engine's time) and answers replay requests.
 */
#ifndef SERVD_ENGINE_KV_EVENTS_H
#define SERVD_ENGINE_KV_EVENTS_H

#include <stdbool.h>
#include <stdint.h>

struct servd_prefix_cache;

typedef struct servd_kv_events servd_kv_events;
typedef struct kv_events_source kv_events_source;

typedef struct servd_kv_events_options {
  /* PUB socket: bound when the address is a wildcard ("tcp://" "*:5557") or ipc://, else connected
   * to (a subscriber that binds, "tcp://epp:5557"): vLLM's rule. */
  const char *endpoint;
  const char *replay_endpoint; /* ROUTER socket; NULL: no replay */
  /* Per model: "{model}" is replaced by the served model name, "{host}" by $POD_IP, else the host
   * name. NULL: "kv@{host}@{model}", the topic llm-d's subscriber parses (pod, model). */
  const char *topic;
  const char *hash_seed; /* kv_block_hash_root's seed; NULL: $PYTHONHASHSEED, else "" */
  int queue_events;      /* per model ring; 0: 8192 */
  int replay_batches;    /* batches kept for replay; 0: 1024 */
} servd_kv_events_options;

/* Binds or connects the sockets and starts the publisher thread. 0, or SERVD_EINVAL naming the
 * endpoint that could not be bound or connected and why (address in use, malformed endpoint). */
int servd_kv_events_create(const servd_kv_events_options *o, servd_kv_events **out);
/* Publishes what the rings still hold, then closes. Accepts NULL. Models must be detached first. */
void servd_kv_events_destroy(servd_kv_events *e);

/* The process-wide publisher every model's options get (servd_model_options_default; repository
 * loads too); NULL: none. Set before loading models; e outlives them. */
void servd_engine_set_kv_events(servd_kv_events *e);
servd_kv_events *servd_kv_events_default(void);

/* Hooks pc (on its scheduler thread, before it caches anything) to publish under model's topic,
 * starting with an AllBlocksCleared. gpu: the medium. 0 or SERVD_ENOMEM. */
int servd_kv_events_attach(servd_kv_events *e, struct servd_prefix_cache *pc, const char *model, bool gpu,
                           kv_events_source **out);
/* Unhooks pc and publishes an AllBlocksCleared for the model (it is unloading). Accepts NULL. */
void servd_kv_events_detach(kv_events_source *s, struct servd_prefix_cache *pc);
/* A source's counters: events queued, events dropped because its ring was full. */
void servd_kv_events_source_stats(const kv_events_source *s, uint64_t *queued, uint64_t *dropped);

#endif
