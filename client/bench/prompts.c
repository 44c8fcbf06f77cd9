/* Prompts: random word sequences of a requested length, or the first human turn of ShareGPT
 * conversations. Both are a pure function of (seed, request index), so a seed reproduces a run. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "bench.h"

/* Common English words that byte-pair tokenizers (Llama, GPT-2, Qwen, SmolLM) encode as a single
 * token when preceded by a space, so n words make a prompt of about n tokens. */
static const char *const kWords[] = {
    "the",     "of",    "and",    "to",      "in",      "is",      "you",     "that",      "it",     "he",
    "was",     "for",   "on",     "are",     "as",      "with",    "his",     "they",      "at",     "be",
    "this",    "have",  "from",   "or",      "one",     "had",     "by",      "word",      "but",    "not",
    "what",    "all",   "were",   "we",      "when",    "your",    "can",     "said",      "there",  "use",
    "an",      "each",  "which",  "she",     "do",      "how",     "their",   "if",        "will",   "up",
    "other",   "about", "out",    "many",    "then",    "them",    "these",   "so",        "some",   "her",
    "would",   "make",  "like",   "him",     "into",    "time",    "has",     "look",      "two",    "more",
    "write",   "go",    "see",    "number",  "no",      "way",     "could",   "people",    "my",     "than",
    "first",   "water", "been",   "call",    "who",     "its",     "now",     "find",      "long",   "down",
    "day",     "did",   "get",    "come",    "made",    "may",     "part",    "over",      "new",    "sound",
    "take",    "only",  "little", "work",    "know",    "place",   "year",    "live",      "me",     "back",
    "give",    "most",  "very",   "after",   "thing",   "our",     "just",    "name",      "good",   "man",
    "think",   "say",   "great",  "where",   "help",    "through", "much",    "before",    "line",   "right",
    "too",     "mean",  "old",    "any",     "same",    "tell",    "boy",     "follow",    "came",   "want",
    "show",    "also",  "around", "form",    "three",   "small",   "set",     "put",       "end",    "does",
    "another", "well",  "large",  "must",    "big",     "even",    "such",    "because",   "turn",   "here",
    "why",     "ask",   "went",   "men",     "read",    "need",    "land",    "different", "home",   "us",
    "move",    "try",   "kind",   "hand",    "picture", "again",   "change",  "off",       "play",   "spell",
    "air",     "away",  "animal", "house",   "point",   "page",    "letter",  "mother",    "answer", "found",
    "study",   "still", "learn",  "should",  "world",   "high",    "every",   "near",      "add",    "food",
    "between", "own",   "below",  "country", "plant",   "last",    "school",  "father",    "keep",   "tree",
    "never",   "start", "city",   "earth",   "eye",     "light",   "thought", "head",      "under",  "story",
};
#define N_WORDS (sizeof kWords / sizeof kWords[0])

typedef struct entry {
  char *prompt; /* owned */
  int in_tokens, out_tokens;
} entry;

struct bench_prompts {
  const bench_config *cfg; /* borrowed; outlives the prompts */
  char *buf;               /* the latest random prompt; owned */
  size_t cap;
  entry *entries; /* dataset, in a seeded shuffled order; owned */
  long n;
};

/* Rough token estimate without a tokenizer: about 4 characters of English per token. */
static int estimate_tokens(const char *s) {
  size_t n = strlen(s);
  return (int)((n + 3) / 4);
}

static const char *turn_value(json_t *turn, const char *const *roles) {
  json_t *from = json_object_get(turn, "from");
  if (!json_is_string(from)) from = json_object_get(turn, "role");
  json_t *value = json_object_get(turn, "value");
  if (!json_is_string(value)) value = json_object_get(turn, "content");
  if (!json_is_string(from) || !json_is_string(value)) return NULL;
  for (int i = 0; roles[i]; i++)
    if (strcmp(json_string_value(from), roles[i]) == 0) return json_string_value(value);
  return NULL;
}

/* Adds the conversation's first human turn (and sizes the output after the reply). */
static int add_conversation(bench_prompts *p, json_t *item, size_t *cap) {
  static const char *const human[] = {"human", "user", NULL};
  static const char *const gpt[] = {"gpt", "assistant", "chatgpt", "bard", NULL};
  json_t *conv = json_object_get(item, "conversations");
  if (!json_is_array(conv) || json_array_size(conv) == 0) return 0;
  const char *prompt = turn_value(json_array_get(conv, 0), human);
  if (!prompt || !*prompt) return 0;
  const char *reply = json_array_size(conv) > 1 ? turn_value(json_array_get(conv, 1), gpt) : NULL;
  if (p->n == (long)*cap) {
    size_t nc = *cap ? *cap * 2 : 1024;
    entry *e = realloc(p->entries, nc * sizeof *e);
    if (!e) return -1;
    p->entries = e;
    *cap = nc;
  }
  entry *e = &p->entries[p->n];
  e->prompt = strdup(prompt);
  if (!e->prompt) return -1;
  e->in_tokens = estimate_tokens(prompt);
  int out = p->cfg->output_len;
  if (out <= 0) {
    out = reply ? estimate_tokens(reply) : 128;
    if (out < 4) out = 4;
  }
  e->out_tokens = out;
  p->n++;
  return 0;
}

static int load_dataset(bench_prompts *p, const char *path) {
  FILE *f = fopen(path, "r");
  if (!f) {
    fprintf(stderr, "servd-bench: cannot open dataset %s\n", path);
    return -1;
  }
  size_t cap = 0;
  int first = fgetc(f);
  while (first == ' ' || first == '\n' || first == '\r' || first == '\t') first = fgetc(f);
  if (first != EOF) ungetc(first, f);
  int rc = -1;
  json_error_t jerr;
  if (first == '[') { /* the original ShareGPT file is one JSON array */
    json_t *arr = json_loadf(f, 0, &jerr);
    if (!json_is_array(arr)) {
      fprintf(stderr, "servd-bench: dataset %s: line %d: %s\n", path, jerr.line, jerr.text);
      json_decref(arr);
      goto done;
    }
    size_t i;
    json_t *item;
    json_array_foreach(arr, i, item) {
      if (add_conversation(p, item, &cap)) {
        json_decref(arr);
        goto done;
      }
    }
    json_decref(arr);
  } else { /* JSONL: one conversation object per line */
    char *line = NULL;
    size_t lcap = 0;
    ssize_t n;
    long lineno = 0;
    while ((n = getline(&line, &lcap, f)) >= 0) {
      lineno++;
      if (n == 0 || strspn(line, " \t\r\n") == (size_t)n) continue;
      json_t *item = json_loadb(line, (size_t)n, 0, &jerr);
      if (!json_is_object(item)) {
        fprintf(stderr,
                "servd-bench: dataset %s:%ld: expected a JSON object with "
                "\"conversations\": %s\n",
                path, lineno, item ? "not an object" : jerr.text);
        json_decref(item);
        free(line);
        goto done;
      }
      int arc = add_conversation(p, item, &cap);
      json_decref(item);
      if (arc) {
        free(line);
        goto done;
      }
    }
    free(line);
  }
  if (p->n == 0) {
    fprintf(stderr,
            "servd-bench: dataset %s has no conversation whose first turn is from "
            "\"human\"\n",
            path);
    goto done;
  }
  rc = 0;
done:
  fclose(f);
  return rc;
}

bench_prompts *bench_prompts_create(const bench_config *cfg) {
  bench_prompts *p = calloc(1, sizeof *p);
  if (!p) return NULL;
  p->cfg = cfg;
  if (cfg->dataset) {
    if (load_dataset(p, cfg->dataset)) goto fail;
    bench_rng r;
    bench_rng_seed(&r, bench_mix(cfg->seed, 0x5ba5e7ULL));
    for (long i = p->n - 1; i > 0; i--) { /* Fisher-Yates */
      long j = (long)(bench_rng_next(&r) % (uint64_t)(i + 1));
      entry t = p->entries[i];
      p->entries[i] = p->entries[j];
      p->entries[j] = t;
    }
  }
  return p;
fail:
  bench_prompts_destroy(p);
  return NULL;
}

void bench_prompts_destroy(bench_prompts *p) {
  if (!p) return;
  for (long i = 0; i < p->n; i++) free(p->entries[i].prompt);
  free(p->entries);
  free(p->buf);
  free(p);
}

long bench_prompts_count(const bench_prompts *p) { return p->n; }

/* Appends n seeded random words to buf at len (a space before each but a leading one); returns the
 * new length. buf has room for 12 bytes a word (the longest is 9 bytes plus a space). */
static size_t put_words(char *buf, size_t len, uint64_t seed, int n) {
  bench_rng r;
  bench_rng_seed(&r, seed);
  for (int i = 0; i < n; i++) {
    const char *w = kWords[bench_rng_next(&r) % N_WORDS];
    size_t wl = strlen(w);
    if (len) buf[len++] = ' ';
    memcpy(buf + len, w, wl);
    len += wl;
  }
  buf[len] = '\0';
  return len;
}

char *bench_random_words(uint64_t seed, int n) {
  char *buf = malloc((size_t)(n > 0 ? n : 0) * 12 + 1);
  if (buf) put_words(buf, 0, seed, n);
  return buf;
}

uint64_t bench_prefix_seed(const bench_config *cfg, uint64_t k) {
  return bench_mix(bench_mix(cfg->seed, 0x9f3e1c5ULL), k);
}

const char *bench_prompts_get(bench_prompts *p, uint64_t idx, int *in_tokens, int *out_tokens) {
  if (p->n > 0) {
    entry *e = &p->entries[idx % (uint64_t)p->n];
    *in_tokens = e->in_tokens;
    *out_tokens = e->out_tokens;
    return e->prompt;
  }
  int n = p->cfg->input_len > 0 ? p->cfg->input_len : 1;
  int np = p->cfg->shared_prefix_len > 0 ? p->cfg->shared_prefix_len : 0;
  size_t need = (size_t)(np + n) * 12 + 1; /* longest word is 9 bytes plus a space */
  if (need > p->cap) {
    char *b = realloc(p->buf, need);
    if (!b) return NULL;
    p->buf = b;
    p->cap = need;
  }
  size_t len = 0;
  /* The shared prefix: a function of (seed, prefix number) only, so requests that draw the same
   * number send the same words; the own part after it is a function of (seed, idx). */
  if (np > 0) {
    uint64_t k = idx % (uint64_t)(p->cfg->prefixes > 0 ? p->cfg->prefixes : 1);
    len = put_words(p->buf, len, bench_prefix_seed(p->cfg, k), np);
  }
  len = put_words(p->buf, len, bench_mix(p->cfg->seed, idx), n);
  p->buf[len] = '\0';
  *in_tokens = np + n;
  *out_tokens = p->cfg->output_len > 0 ? p->cfg->output_len : 128;
  return p->buf;
}
