/* Continuous-batching scheduler: see scheduler.h for the policy. */
#include "engine/scheduler.h"

#include <stdlib.h>
#include <string.h>

#include "servd/status.h"

static void list_remove(sched_list *l, sched_seq *q) {
  if (q->prev) q->prev->next = q->next;
  else l->head = q->next;
  if (q->next) q->next->prev = q->prev;
  else l->tail = q->prev;
  q->prev = q->next = NULL;
  l->n--;
}

static void list_push_back(sched_list *l, sched_seq *q) {
  q->next = NULL;
  q->prev = l->tail;
  if (l->tail) l->tail->next = q;
  else l->head = q;
  l->tail = q;
  l->n++;
}

/* Whether a runs before b in the waiting queue: better priority, then earlier arrival. */
static bool runs_before(const sched_seq *a, const sched_seq *b) {
  return a->priority != b->priority ? a->priority < b->priority : a->order < b->order;
}

static void list_insert_before(sched_list *l, sched_seq *at, sched_seq *q) {
  if (!at) {
    list_push_back(l, q);
    return;
  }
  q->next = at;
  q->prev = at->prev;
  if (at->prev) at->prev->next = q;
  else l->head = q;
  at->prev = q;
  l->n++;
}

/* Waiting queue: (priority, arrival) order, so a preempted sequence returns to its place. */
static void list_insert_ordered(sched_list *l, sched_seq *q) {
  sched_seq *at = l->tail;
  while (at && runs_before(q, at)) at = at->prev; /* from the tail: new arrivals go last */
  list_insert_before(l, at ? at->next : l->head, q);
}

/* Running list: by priority only, a newcomer after its equals, so that with one priority the list
 * stays in admission order and the tail (the preemption victim) is the worst, newest sequence. */
static void list_insert_running(sched_list *l, sched_seq *q) {
  sched_seq *at = l->tail;
  while (at && q->priority < at->priority) at = at->prev;
  list_insert_before(l, at ? at->next : l->head, q);
}

int sched_init(servd_scheduler *s, const sched_config *cfg, servd_kv_cache *kv) {
  memset(s, 0, sizeof *s);
  if (!kv || cfg->max_batch_tokens < 1 || cfg->max_seqs < 1 || cfg->max_seq_len < 1)
    return servd_fail(SERVD_EINVAL,
                      "scheduler: max_batch_tokens=%d max_seqs=%d max_seq_len=%d: "
                      "expected all >= 1 and a KV cache",
                      cfg->max_batch_tokens, cfg->max_seqs, cfg->max_seq_len);
  s->cfg = *cfg;
  size_t n = (size_t)cfg->max_seqs;
  int rc = servd_step_arrays_init(&s->step, cfg->max_batch_tokens, cfg->max_seqs, "scheduler");
  if (rc) goto fail;
  if ((rc = bm_init(&s->bm, kv, cfg->max_seq_len, cfg->prefix_cache, cfg->cache_key))) goto fail;
  s->planned = calloc(n, sizeof *s->planned);
  s->starved = calloc(n, sizeof *s->starved);
  if (!s->planned || !s->starved) {
    rc = servd_fail(SERVD_ENOMEM, "scheduler: sequence lists for %d sequences", cfg->max_seqs);
    goto fail;
  }
  return 0;
fail:
  sched_free(s);
  return rc;
}

void sched_free(servd_scheduler *s) {
  if (!s) return;
  free(s->planned);
  free(s->starved);
  servd_step_arrays_free(&s->step);
  bm_free(&s->bm);
  memset(s, 0, sizeof *s);
}

int sched_seq_init(servd_scheduler *s, sched_seq *q) {
  int rc = bm_table_init(&s->bm, &q->table);
  if (rc) return rc;
  q->n_computed = 0;
  q->n_cached = 0;
  q->state = SCHED_NEW;
  q->prev = q->next = NULL;
  return 0;
}

void sched_seq_free(sched_seq *q) {
  if (!q) return;
  bm_table_free(&q->table);
}

void sched_add(servd_scheduler *s, sched_seq *q) {
  q->order = s->next_order++;
  q->state = SCHED_WAITING;
  list_insert_ordered(&s->waiting, q);
}

static void release_blocks(servd_scheduler *s, sched_seq *q) {
  bm_release(&s->bm, &q->table);
  q->n_computed = 0;
}

/* Drafts planned for a step that did not run leave the sequence. */
static void drop_drafts(sched_seq *q) {
  q->n_tokens -= q->n_draft;
  q->n_draft = 0;
}

void sched_remove(servd_scheduler *s, sched_seq *q) {
  drop_drafts(q);
  if (q->state == SCHED_WAITING) list_remove(&s->waiting, q);
  else if (q->state == SCHED_RUNNING) list_remove(&s->running, q);
  if (q->state != SCHED_NEW && q->state != SCHED_REMOVED) release_blocks(s, q);
  q->state = SCHED_REMOVED;
  q->chunk = 0;
  q->wants_logits = false;
}

static void preempt(servd_scheduler *s, sched_seq *q) {
  drop_drafts(q);
  list_remove(&s->running, q);
  release_blocks(s, q);
  q->state = SCHED_WAITING;
  q->n_preempted++;
  q->chunk = 0;
  q->wants_logits = false;
  s->preemptions++;
  list_insert_ordered(&s->waiting, q);
}

/* Makes q own enough blocks for its first n tokens; 0, or SERVD_EBUSY having taken none. */
static int grow(servd_scheduler *s, sched_seq *q, int n) { return bm_grow(&s->bm, &q->table, n); }

static int blocks_for(const servd_scheduler *s, int n) { return bm_blocks_for(&s->bm, n); }

/* Whether a running sequence is about to compute q's next full block after its first `hit` cached
 * ones (same tokens from the start, that block not computed yet). Then q waits for it rather than
 * compute the same K/V alongside: requests arriving together with a common prompt (a burst behind
 * one system prompt, the n choices of one request) compute it once. The one computing it is running,
 * so the wait ends: the block is registered, or that sequence is preempted and no longer counts. */
static bool prefix_pending(const servd_scheduler *s, const sched_seq *q, int hit) {
  int end = (hit + 1) * s->bm.block_size;
  if (!s->bm.pc.enabled || end > q->n_tokens - 1) return false;
  for (const sched_seq *r = s->running.head; r; r = r->next)
    if (r->n_computed < end && r->n_tokens >= end && memcmp(r->tokens, q->tokens, (size_t)end * sizeof *q->tokens) == 0)
      return true;
  return false;
}

/* Appends q's chunk to the step's layout. */
static void emit(servd_scheduler *s, sched_seq *q, int chunk) {
  int i = s->n_planned++;
  s->planned[i] = q;
  q->chunk = chunk;
  q->wants_logits = q->n_computed + chunk == q->n_tokens;
  servd_step_arrays *a = &s->step;
  a->q_start[i] = s->n_tokens;
  a->q_len[i] = chunk;
  a->kv_len[i] = q->n_computed + chunk;
  a->block_tables[i] = q->table.ids;
  if (q->n_tokens - q->n_draft - q->n_computed == 1) { /* a decode, or a verify row of its drafts */
    s->n_decode_rows++;
    s->n_verify_tokens += chunk - 1;
  } else {
    s->n_prefill_tokens += chunk;
  }
  for (int j = 0; j < chunk; j++) {
    int p = q->n_computed + j, t = s->n_tokens + j;
    a->tokens[t] = q->tokens[p];
    a->positions[t] = p;
    a->token_types[t] = q->pair_split > 0 && p >= q->pair_split;
    a->slots[t] = q->table.ids[p / s->bm.block_size] * s->bm.block_size + p % s->bm.block_size;
  }
  s->n_tokens += chunk;
  q->n_rows = 0;
  if (q->rows == SCHED_ROWS_ALL || q->n_draft > 0) {
    q->row_pos = q->n_computed;
    for (int j = 0; j < chunk; j++) a->logit_rows[s->n_logit_rows++] = s->n_tokens - chunk + j;
    q->n_rows = chunk;
  } else if (q->rows == SCHED_ROWS_FIRST) {
    q->row_pos = 0;
    if (q->n_computed == 0) a->logit_rows[s->n_logit_rows++] = s->n_tokens - chunk;
    q->n_rows = q->n_computed == 0;
  } else if (q->wants_logits) {
    q->row_pos = q->n_tokens - 1;
    a->logit_rows[s->n_logit_rows++] = s->n_tokens - 1;
    q->n_rows = 1;
  }
}

/* Whether any sequence of the list is (or is not) an embedding. */
static bool list_has(const sched_list *l, bool embed) {
  for (const sched_seq *q = l->head; q; q = q->next)
    if (q->embed == embed) return true;
  return false;
}

/* Estimated cost of `rows` decode rows in one step. Before a decode-only step was seen, a row is
 * taken to cost what a prefill token does (in a batched forward both are one token's row). */
static double decodes_estimate(const servd_scheduler *s, int rows) {
  if (s->cost.decode_row_ns <= 0) return s->cost.prefill_token_ns * rows;
  return s->cost.decode_step_ns + s->cost.decode_row_ns * rows;
}

/* Prefill tokens a step carrying `decoders` decode rows may add: what fits the step's target after
 * the decodes' estimate, the target being max_step_ns or SCHED_STEP_STRETCH x that estimate. Unbounded
 * until a prefill cost was measured (the first steps teach it); never under one block. */
static int prefill_cap(const servd_scheduler *s, int decoders) {
  if (!s->cfg.max_step_ns || decoders == 0 || s->cost.prefill_token_ns <= 0) return INT32_MAX;
  double decodes = decodes_estimate(s, decoders);
  double target = (double)s->cfg.max_step_ns;
  if (target < SCHED_STEP_STRETCH * decodes) target = SCHED_STEP_STRETCH * decodes;
  double n = (target - decodes) / s->cost.prefill_token_ns;
  if (n < s->bm.block_size) return s->bm.block_size;
  return n > INT32_MAX ? INT32_MAX : (int)n;
}

/* A chunk whose every row needs vocabulary-wide logits (prompt logprobs) is cut to
 * SCHED_MAX_LOGIT_CHUNK tokens: 512 rows of a 49k vocabulary would be 100 MB of logits. Hidden
 * rows (embeddings) are small and take the whole chunk. */
static int logit_chunk(const sched_seq *q, int chunk) {
  return q->rows == SCHED_ROWS_ALL && !q->embed && chunk > SCHED_MAX_LOGIT_CHUNK ? SCHED_MAX_LOGIT_CHUNK : chunk;
}

/* The worst running sequence (the running list's tail) has a worse priority than q. */
static bool outranks_running(const servd_scheduler *s, const sched_seq *q) {
  return s->running.tail && s->running.tail->priority > q->priority;
}

#define PLAN_AGAIN 1 /* a running sequence was preempted for a waiting one of better priority */

static int plan_once(servd_scheduler *s, bool may_preempt) {
  s->n_planned = s->n_tokens = s->n_logit_rows = 0;
  s->n_decode_rows = s->n_prefill_tokens = s->n_verify_tokens = 0;
  int budget = s->cfg.max_batch_tokens;
  int total_blocks = servd_kv_cache_n_blocks(s->bm.kv);
  /* The step's kind: embeddings on their turn, or when generation has no work. */
  bool has_embed = list_has(&s->running, true) || list_has(&s->waiting, true);
  bool has_gen = list_has(&s->running, false) || list_has(&s->waiting, false);
  bool embed = s->embed_step = has_embed && (!has_gen || s->embed_turn);

  /* Running decoders each get one reserved token so a long prefill chunk cannot starve them. */
  int decoders = 0;
  for (sched_seq *q = s->running.head; q; q = q->next)
    if (q->embed == embed && q->n_tokens - q->n_draft - q->n_computed == 1) decoders++;
  /* Prefill tokens left to this step: bounded by max_step_ns when it carries decodes. */
  int prefill_left = s->prefill_cap = prefill_cap(s, decoders);
  /* Output rows left (a GPU step's buffers hold max_logit_rows): rows beyond one per sequence (verify
   * rows, prompt logprobs) take what the decoders after them leave. */
  int rows_left = s->cfg.max_logit_rows > 0 && !embed ? s->cfg.max_logit_rows : INT32_MAX;

  /* Running sequences, best first; preempt from the worst, newest end when blocks run out. */
  for (sched_seq *q = s->running.head; q && budget > 0;) {
    sched_seq *next = q->next;
    if (q->embed != embed) {
      q = next;
      continue;
    }
    int need = q->n_tokens - q->n_computed;
    bool decoding = need - q->n_draft == 1;
    if (decoding) decoders--;
    int chunk = need;
    int room = budget - decoders;
    if (chunk > room) chunk = room;
    if ((q->n_draft > 0 || q->rows == SCHED_ROWS_ALL) && chunk > rows_left - decoders) /* a row per token */
      chunk = rows_left - decoders;
    if (q->n_draft > 0 && chunk < need) { /* a verify row is whole: cut drafts that do not fit */
      int cut = need - (chunk > 1 ? chunk : 1);
      q->n_draft -= cut;
      q->n_tokens -= cut;
      chunk = need = q->n_tokens - q->n_computed;
      if (chunk > room) chunk = room;
    }
    if (!decoding && chunk > prefill_left) chunk = prefill_left;
    chunk = logit_chunk(q, chunk);
    if (chunk <= 0) {
      q = next;
      continue;
    }
    int rc;
    while ((rc = grow(s, q, q->n_computed + chunk)) == SERVD_EBUSY) {
      sched_seq *victim = s->running.tail;
      if (victim == q) break;
      if (victim->n_tokens - victim->n_draft - victim->n_computed == 1) decoders--;
      if (next == victim) next = NULL;
      preempt(s, victim);
    }
    if (rc == SERVD_EBUSY) {
      /* q is the newest running sequence and still does not fit: it waits for others to finish,
       * or, alone with the whole cache free, it never will. */
      if (s->running.n == 1 && s->n_planned == 0 && blocks_for(s, q->n_computed + chunk) > total_blocks) {
        sched_remove(s, q);
        s->starved[s->n_starved++] = q;
      } else {
        preempt(s, q);
      }
      break;
    }
    if (rc) return rc;
    emit(s, q, chunk);
    budget -= chunk;
    rows_left -= q->n_rows;
    if (!decoding) prefill_left -= chunk;
    q = next;
  }

  /* Admit waiting sequences in (priority, arrival) order. */
  for (sched_seq *q = s->waiting.head, *after = NULL; q && budget > 0 && prefill_left > 0; q = after) {
    after = q->next;
    if (q->embed != embed) continue; /* the other kind's turn comes next step */
    if (blocks_for(s, q->n_tokens) > total_blocks || q->n_tokens > s->cfg.max_seq_len) {
      /* can never be held at once */
      if (s->n_starved == s->cfg.max_seqs) break; /* report the rest next step */
      sched_remove(s, q);
      s->starved[s->n_starved++] = q;
      continue;
    }
    if (s->running.n >= s->cfg.max_seqs) {
      if (!may_preempt || !outranks_running(s, q)) break;
      preempt(s, s->running.tail);
      return PLAN_AGAIN;
    }
    /* A waiting sequence holds no blocks. Its cached beginning is shared, short of the last token
     * (computed again so that its logits exist). Nothing is taken unless all it needs fits. */
    int evictable_hits = 0;
    prefix_chain chain = {0};
    int hit = 0;
    if (!q->embed && !q->no_cache_hits) {
      bm_fetch(&s->bm, q->tokens, (q->n_tokens - 1) / s->bm.block_size);
      hit = bm_match(&s->bm, q->tokens, (q->n_tokens - 1) / s->bm.block_size, &q->table, &chain, &evictable_hits);
    }
    if (!q->embed && !q->no_cache_hits && prefix_pending(s, q, hit)) break;
    int start = hit * s->bm.block_size;
    int chunk = q->n_tokens - start;
    if (chunk > budget) chunk = budget;
    if (chunk > prefill_left) chunk = prefill_left;
    chunk = logit_chunk(q, chunk);
    if (q->rows == SCHED_ROWS_ALL && !q->embed && chunk > rows_left) chunk = rows_left;
    if (chunk <= 0 || (start + chunk == q->n_tokens && rows_left < 1)) break; /* no output row left */
    if (s->cfg.whole_embeddings && q->embed && start + chunk < q->n_tokens) {
      /* an encoder's prompt waits for a step with room for all of it; alone in a step it never fits */
      if (s->n_planned > 0 || s->n_starved == s->cfg.max_seqs) break;
      sched_remove(s, q);
      s->starved[s->n_starved++] = q;
      continue;
    }
    bool fits = blocks_for(s, start + chunk) - hit <= bm_available(&s->bm) - evictable_hits;
    int rc = 0;
    if (fits) {
      if ((rc = bm_acquire(&s->bm, &q->table, hit, &chain))) return rc;
      q->n_computed = start;
      if ((rc = grow(s, q, start + chunk))) {
        release_blocks(s, q);
        if (rc != SERVD_EBUSY) return rc;
        fits = false;
      }
    }
    if (!fits) {
      /* Short of blocks: a better priority takes them from the worst running sequence. The plan
       * so far may hold that one, so it is made again from the start without it. */
      if (!may_preempt || !outranks_running(s, q)) break;
      preempt(s, s->running.tail);
      return PLAN_AGAIN;
    }
    if (s->bm.pc.enabled) {
      s->bm.pc.queries += (uint64_t)q->n_tokens;
      s->bm.pc.hits += (uint64_t)start;
    }
    if (q->n_preempted == 0) q->n_cached = start;
    list_remove(&s->waiting, q);
    q->state = SCHED_RUNNING;
    list_insert_running(&s->running, q);
    emit(s, q, chunk);
    budget -= chunk;
    rows_left -= q->n_rows;
    prefill_left -= chunk;
  }
  return s->n_tokens;
}

int sched_plan(servd_scheduler *s) {
  s->n_starved = 0;
  /* Each retry preempts a running sequence for a better one; the bound only guards against a cycle
   * the ordering rules out. Sequences admitted by an abandoned attempt are running now and keep the
   * blocks they took. */
  int rc = PLAN_AGAIN;
  for (int tries = 0; rc == PLAN_AGAIN && tries <= 2 * s->cfg.max_seqs; tries++) rc = plan_once(s, true);
  if (rc == PLAN_AGAIN) rc = plan_once(s, false);
  if (rc > 0) s->embed_turn = !s->embed_step;
  return rc;
}

/* Full blocks whose K/V is computed become findable (an embedding's stay private). */
static void register_blocks(servd_scheduler *s, sched_seq *q) {
  if (!q->embed) bm_register(&s->bm, &q->table, q->tokens, q->n_computed);
}

void sched_commit(servd_scheduler *s) {
  for (int i = 0; i < s->n_planned; i++) {
    sched_seq *q = s->planned[i];
    if (q->state == SCHED_RUNNING) {
      q->n_computed += q->chunk;
      if (q->n_draft == 0) register_blocks(s, q);
    }
    q->chunk = 0;
  }
}

void sched_truncate(servd_scheduler *s, sched_seq *q, int n_kv) {
  q->n_draft = 0;
  if (q->state != SCHED_RUNNING) return;
  if (n_kv < q->n_computed) q->n_computed = n_kv;
  bm_truncate(&s->bm, &q->table, q->n_tokens);
  register_blocks(s, q);
}

void sched_register_final(servd_scheduler *s, sched_seq *q, int n_kv) {
  if (q->state == SCHED_RUNNING && !q->embed) bm_register(&s->bm, &q->table, q->tokens, n_kv);
}

double sched_decode_cost(const servd_scheduler *s, int rows) { return rows > 0 ? decodes_estimate(s, rows) : 0; }

bool sched_verify_cost(const servd_scheduler *s, double *fixed_ns, double *token_ns) {
  const sched_cost *c = &s->cost;
  *fixed_ns = 0;
  *token_ns = c->prefill_token_ns; /* before any verify step: a draft costs what a prefill token does */
  if (c->vw <= 0 || c->vx <= 0) return false;
  double mx = c->vx / c->vw, my = c->vy / c->vw, var = c->vxx / c->vw - mx * mx;
  double slope = var >= 1 ? (c->vxy / c->vw - mx * my) / var : 0, fixed = my - slope * mx;
  if (slope > 0 && fixed >= 0) {
    *fixed_ns = fixed;
    *token_ns = slope;
  } else if (my > 0) {
    *token_ns = my / mx; /* one draft count seen, or noise: through the origin */
  }
  return true;
}

/* Weight of a new measurement in the running estimates: about the last five steps count. */
#define COST_ALPHA 0.2

static void ewma(double *avg, double x) { *avg = *avg > 0 ? *avg + COST_ALPHA * (x - *avg) : x; }

/* Decode-only steps: a fixed cost plus one per row, fitted over the last few steps. A cost per row
 * alone, learned while 4 streams decoded (7.9 ms a row on the default model), charged 27 rows about
 * twice what they took (the fixed cost counted 27 times), and stretched steps ran twice too long. */
static void fit_decodes(sched_cost *c, int rows, double t) {
  double x[5] = {1, rows, (double)rows * rows, t, rows * t}, *sum[5] = {&c->w, &c->r, &c->rr, &c->t, &c->rt};
  double a = c->w > 0 ? COST_ALPHA : 1;
  for (int i = 0; i < 5; i++) *sum[i] += a * (x[i] - *sum[i]);
  double mr = c->r / c->w, mt = c->t / c->w, var = c->rr / c->w - mr * mr;
  double slope = var >= 1 ? (c->rt / c->w - mr * mt) / var : 0, fixed = mt - slope * mr;
  c->decode_line = slope > 0 && fixed >= 0;
  if (c->decode_line) {
    c->decode_row_ns = slope;
    c->decode_step_ns = fixed;
  } else {
    /* One row count seen: through the origin. Exact at that count, too high above it: prefill then
     * gets more time, never less. (A prefill token's slope instead ran steps past the bound where a
     * row costs more than a token.) */
    c->decode_row_ns = c->t / c->r;
    c->decode_step_ns = 0;
  }
}

/* Weight of a step in the plane: about the last 32 steps count (three unknowns need more steps than
 * the decode line's two). */
#define JOINT_ALPHA (1.0 / 32)
/* Steps seen before the plane is trusted. */
#define JOINT_MIN_STEPS 8
/* How far from collinear rows and tokens must be (1 - their correlation^2): in a stretched step the
 * prefill cap follows the decode estimate, so tokens can track rows; then the plane is not defined. */
#define JOINT_MIN_SPREAD 0.05

/* Adds a step to the plane's sums (West's weighted update of means and co-moments). */
static void joint_add(sched_cost *c, int rows, int tokens, double t) {
  double a = c->jw > 0 ? JOINT_ALPHA : 1, keep = 1 - a;
  double dr = rows - c->jr, dk = tokens - c->jk, dt = t - c->jt;
  c->jrr = keep * (c->jrr + a * dr * dr);
  c->jkk = keep * (c->jkk + a * dk * dk);
  c->jrk = keep * (c->jrk + a * dr * dk);
  c->jrt = keep * (c->jrt + a * dr * dt);
  c->jkt = keep * (c->jkt + a * dk * dt);
  c->jr += a * dr;
  c->jk += a * dk;
  c->jt += a * dt;
  c->jw = 1;
  c->joint_steps++;
}

/* How much more or less a decode row may cost than a prefill token for the plane to be believed: both
 * are one row through the same matmuls; a decode row adds its logits, sampling and a longer attention.
 * On a loaded host the steps' times are noisy enough to fit a row at 0.07 ms beside a token at 2 ms. */
#define JOINT_ROW_TOKEN_MIN 0.5
#define JOINT_ROW_TOKEN_MAX 8.0

/* The plane's coefficients when the recent steps define it and it is physical (every cost positive,
 * the fixed one not negative, a row's cost near a token's); false otherwise. */
static bool joint_fit(const sched_cost *c, double *fixed, double *row, double *token) {
  if (c->joint_steps < JOINT_MIN_STEPS || c->jrr < 1 || c->jkk < 1) return false;
  double det = c->jrr * c->jkk - c->jrk * c->jrk;
  if (det < JOINT_MIN_SPREAD * c->jrr * c->jkk) return false;
  *row = (c->jrt * c->jkk - c->jkt * c->jrk) / det;
  *token = (c->jkt * c->jrr - c->jrt * c->jrk) / det;
  *fixed = c->jt - *row * c->jr - *token * c->jk;
  return *token > 0 && *fixed >= 0 && *row >= JOINT_ROW_TOKEN_MIN * *token && *row <= JOINT_ROW_TOKEN_MAX * *token;
}

/* Steps with verify rows: what they cost beyond their decode rows' (and prefill tokens') estimate,
 * against their draft tokens, as a line (fixed: the step's share a plain decode step does not pay,
 * e.g. running the model's code where decode steps replay a plan; per draft token). */
static void fit_verify(sched_cost *c, int drafts, double extra) {
  double x[5] = {1, drafts, (double)drafts * drafts, extra, drafts * extra};
  double *sum[5] = {&c->vw, &c->vx, &c->vxx, &c->vy, &c->vxy};
  double a = c->vw > 0 ? COST_ALPHA : 1;
  for (int i = 0; i < 5; i++) *sum[i] += a * (x[i] - *sum[i]);
}

void sched_observe(servd_scheduler *s, int64_t step_ns) {
  if (step_ns <= 0 || s->n_tokens == 0) return;
  double t = (double)step_ns;
  sched_cost *c = &s->cost;
  if (s->n_verify_tokens > 0) { /* kept out of the prefill and decode estimates */
    if (c->decode_row_ns > 0) {
      double extra = t - decodes_estimate(s, s->n_decode_rows) - c->prefill_token_ns * s->n_prefill_tokens;
      fit_verify(c, s->n_verify_tokens, extra > 0 ? extra : 0);
    }
    return;
  }
  joint_add(c, s->n_decode_rows, s->n_prefill_tokens, t);
  if (s->n_prefill_tokens == 0) {
    fit_decodes(c, s->n_decode_rows, t);
  } else if (c->decode_row_ns <= 0 && s->n_decode_rows > 0) {
    /* A mixed step: what its decode rows are estimated to cost is not the prefill's. Without a decode
     * estimate yet (a burst of prompts has no decode-only step until all are in), the rows are what
     * the step cost beyond its prefill estimate: charging the whole step to prefill made the prompts
     * look ever costlier and pinned their chunks to one block. With neither, every row is a token. */
    if (c->prefill_token_ns > 0) {
      double rows = t - c->prefill_token_ns * s->n_prefill_tokens;
      if (rows > 0) ewma(&c->decode_row_ns, rows / s->n_decode_rows);
    } else {
      ewma(&c->prefill_token_ns, t / (s->n_decode_rows + s->n_prefill_tokens));
    }
  } else {
    /* A step faster than its decodes' estimate (made from steps of another size) says nothing of the
     * prefill: pulling the estimate toward 0 let the next chunk run for seconds. */
    double prefill = t - decodes_estimate(s, s->n_decode_rows);
    if (prefill > 0) ewma(&c->prefill_token_ns, prefill / s->n_prefill_tokens);
  }
  /* While the decode-only steps had one row count, their line runs through the origin and charges
   * large batches the small one's fixed share per row (0.71-0.92x the output at 32 streams); the
   * plane over every step, mixed ones included, separates the fixed cost from the rows'. */
  double fixed, row, token;
  c->joint = !c->decode_line && joint_fit(c, &fixed, &row, &token);
  if (c->joint) {
    c->decode_step_ns = fixed;
    c->decode_row_ns = row;
    c->prefill_token_ns = token;
  }
}

int sched_used_blocks(const servd_scheduler *s) { return bm_used(&s->bm); }

int sched_cached_blocks(const servd_scheduler *s) { return s->bm.pc.n_cached; }
