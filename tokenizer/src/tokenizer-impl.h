/* Internal structures of the byte-level BPE tokenizer (not part of the API). */
#ifndef SERVD_TOKENIZER_IMPL_H
#define SERVD_TOKENIZER_IMPL_H

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/tokenizer.h"

/* ---- UTF-8 and the byte-level alphabet (utf8.c) ----------------------------------------------- */
enum { UTF8_VALID = 0, UTF8_INVALID = 1, UTF8_INCOMPLETE = 2 };
/* Classifies the sequence starting at s[0] (n >= 1 bytes available). *len: bytes of the valid
 * character, of the maximal invalid subpart (replaced by one U+FFFD), or of the incomplete tail. */
int utf8__classify(const uint8_t *s, size_t n, size_t *len);
/* Length of the valid UTF-8 text, or (size_t)-1 if all of s is valid. Returns the first bad offset. */
size_t utf8__first_invalid(const uint8_t *s, size_t n);
/* Encodes cp into out (4 bytes room), returns the length. */
int utf8__encode(uint32_t cp, char *out);
/* Decodes one valid character at s (n bytes available); returns its length, 0 when invalid. */
int utf8__decode(const uint8_t *s, size_t n, uint32_t *cp);
/* GPT-2's byte -> code point table and its inverse (code points < 324; -1 where none). */
extern uint32_t bytelevel__byte_to_cp[256];
extern int16_t bytelevel__cp_to_byte[324];
void bytelevel__init(void);

/* ---- a growable byte buffer --------------------------------------------------------------------- */
typedef struct tok_buf {
  char *p;
  size_t len, cap;
} tok_buf;
int tok_buf_reserve(tok_buf *b, size_t extra);
int tok_buf_append(tok_buf *b, const void *s, size_t n);

/* ---- string -> id hash map (open addressing, keys copied into one pool) ------------------------- */
typedef struct str_map {
  uint64_t *hash; /* 0: empty slot */
  uint32_t *off;  /* key offset in pool */
  uint32_t *klen;
  int32_t *val;
  size_t cap, count; /* cap is a power of two */
  tok_buf pool;
} str_map;
int str_map_init(str_map *m, size_t expected);
void str_map_free(str_map *m);
uint64_t str_map_hash(const void *s, size_t n);
/* Inserts or overwrites. */
int str_map_put(str_map *m, const void *key, size_t n, int32_t val);
/* -1 when absent. */
int32_t str_map_get(const str_map *m, const void *key, size_t n);

/* ---- pre-tokenizer pipeline (pretok.c) ---------------------------------------------------------- */
typedef enum pre_kind { PRE_SPLIT = 0, PRE_BYTELEVEL = 1 } pre_kind;
typedef enum split_behavior {
  SPLIT_ISOLATED = 0,
  SPLIT_REMOVED,
  SPLIT_MERGED_PREV,
  SPLIT_MERGED_NEXT,
  SPLIT_CONTIGUOUS,
} split_behavior;

typedef struct pre_step {
  pre_kind kind;
  pcre2_code *re; /* NULL for ByteLevel without regex */
  split_behavior behavior;
  bool invert;
  bool add_prefix_space; /* ByteLevel */
} pre_step;

typedef struct span {
  uint32_t off, len;
} span;
typedef struct part {
  uint32_t start, end;
  bool match;
} part;

/* Per-call scratch for pre-tokenization and BPE; grows, never shrinks during a call. */
typedef struct tok_work {
  span *a, *b;
  size_t a_cap, b_cap, na;
  struct part *parts; /* matches and gaps of one span */
  size_t parts_cap;
  pcre2_match_data *md;
  pcre2_match_context *mctx;
  pcre2_jit_stack *jit;
  tok_buf text; /* text copy when ByteLevel inserts prefix spaces */
  /* BPE symbols and heap */
  struct bpe_sym *sym;
  struct bpe_merge *heap;
  size_t sym_cap, heap_cap;
} tok_work;

/* Compiles a pattern in UTF + UCP mode with JIT (literal: PCRE2_LITERAL). field names the
 * tokenizer.json field for messages. */
int pre__compile(const char *pattern, size_t len, bool literal, const char *field, pcre2_code **out);
/* Splits text[0..len) through the steps; resulting spans in w->a[0..w->na), offsets into *base
 * (text, or w->text when a step inserted bytes). */
int pre__run(const pre_step *steps, int n_steps, const char *text, size_t len, tok_work *w, const char **base);

/* ---- BPE (bpe.c) -------------------------------------------------------------------------------- */
typedef struct bpe_sym {
  int32_t id;
  int32_t prev, next;
  uint32_t len;
} bpe_sym;
typedef struct bpe_merge {
  int32_t rank, pos, new_id;
} bpe_merge;

typedef struct merge_map {
  uint64_t *key; /* (a << 32 | b) + 1; 0: empty */
  int32_t *rank, *new_id;
  size_t cap, count;
} merge_map;
int merge_map_init(merge_map *m, size_t expected);
void merge_map_free(merge_map *m);
int merge_map_put(merge_map *m, int32_t a, int32_t b, int32_t rank, int32_t new_id);
/* Fibonacci hashing: the top bits of the product depend on both ids (the low ones mostly on the
 * right id alone, which made long probe chains). cap is a power of two >= 2. */
static inline size_t pair_slot(uint64_t k, size_t cap) {
  return (size_t)((k * 0x9E3779B97F4A7C15ull) >> (64 - __builtin_ctzll((unsigned long long)cap)));
}
/* 1 and rank/new_id when the pair merges, else 0. */
static inline int merge_map_get(const merge_map *m, int32_t a, int32_t b, int32_t *rank, int32_t *new_id) {
  uint64_t k = (((uint64_t)(uint32_t)a << 32) | (uint32_t)b) + 1;
  size_t j = pair_slot(k, m->cap);
  while (m->key[j]) {
    if (m->key[j] == k) {
      *rank = m->rank[j];
      *new_id = m->new_id[j];
      return 1;
    }
    j = (j + 1) & (m->cap - 1);
  }
  return 0;
}

/* Word cache: piece bytes -> ids, bounded; cleared when full. */
typedef struct word_cache {
  pthread_mutex_t lock;
  str_map map;      /* piece -> index into entries */
  int32_t *ent_off; /* ids offset per entry */
  int32_t *ent_n;
  int32_t *ids;
  size_t n_ent, ent_cap, n_ids, ids_cap;
} word_cache;

/* ---- SentencePiece-style BPE (spm.c) ------------------------------------------------------------
 * Hugging Face's BPE model works on characters; byte-level tokenizers map bytes to characters first
 * (ByteLevel), SentencePiece-style ones start from the characters themselves, spell unknown ones
 * as <0xXX> byte tokens (byte_fallback) and mark spaces with a metaspace character. */
typedef struct text_edit {
  char *from; /* NULL: prepend `to` (Prepend normalizer) */
  char *to;
  size_t from_len, to_len;
} text_edit;
enum { META_NEVER = 0, META_ALWAYS, META_FIRST };
enum { MAX_EDITS = 8 };

struct json_t;
/* normalizer: null | Prepend | Replace{pattern: {String}} | Sequence of these. */
int spm__parse_normalizer(servd_tokenizer *t, struct json_t *n, const char *field);
/* A Metaspace pre-tokenizer node. */
int spm__parse_metaspace(servd_tokenizer *t, struct json_t *pt, const char *field);
/* decoder: null | ByteLevel | Replace{String} | ByteFallback | Fuse | Strip | Metaspace | Sequence. */
int spm__parse_decoder(servd_tokenizer *t, struct json_t *d, const char *field);
/* The bytes a token string stands for under a character-level decoder; *is_byte for <0xXX>. */
int spm__token_bytes(const servd_tokenizer *t, const char *s, size_t n, tok_buf *out, bool *is_byte);
/* Appends the normalized text of s[0..n) to out. */
int spm__normalize(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_buf *out);
/* Appends the Metaspace form of s[0..n) to out (spaces replaced, the prefix added as the scheme says;
 * at_origin: the text starts at offset 0 of the input). */
int spm__metaspace(const servd_tokenizer *t, const uint8_t *s, size_t n, bool at_origin, tok_buf *out);
/* Leading bytes of token `id` (piece p, pl bytes) the decoder drops at this point of a decode: the
 * Strip decoder's leading spaces of the whole text, the Metaspace decoder's of the first token.
 * *first and *budget carry the state across tokens (start: true and t->strip_left). */
size_t spm__lead_cut(const servd_tokenizer *t, int32_t id, const char *p, size_t pl, bool *first, int *budget);

/* ---- WordPiece (wordpiece.c) ------------------------------------------------------------------- */
typedef struct wp_normalizer {
  bool on, clean_text, chinese, strip_accents, lowercase;
} wp_normalizer;
typedef struct wp_model {
  wp_normalizer norm;
  char prefix[16]; /* continuing_subword_prefix, "##" */
  size_t prefix_len;
  int max_chars;    /* max_input_chars_per_word */
  uint8_t *is_cont; /* per id: a vocabulary entry starting with the prefix */
  size_t longest;   /* bytes of the longest vocabulary entry plus the prefix: no piece is longer */
} wp_model;

/* A post_processor template: its special ids in order, where the sequences go among them (before
 * specials[a_at], specials[b_at]; b_at -1 in a single template) and every position's type id. */
typedef struct tok_template {
  int32_t *ids, *types;
  int n, a_at, b_at;
  int32_t a_type, b_type;
} tok_template;

/* A character class: sorted, disjoint inclusive ranges of code points. */
typedef struct wp_class {
  const uint32_t (*r)[2];
  size_t n;
} wp_class;
/* Hugging Face tokenizers' classes (wordpiece_tables.c, generated): punctuation BertPreTokenizer
 * splits off, nonspacing marks accent stripping drops, controls clean_text drops (non-ASCII). */
extern const wp_class wp__punct, wp__mark, wp__control;
bool wp__in(const wp_class *k, uint32_t c);

struct json_t;
/* model.type WordPiece: normalizer, pre_tokenizer, decoder and model fields (refusing others). */
int wp__parse(servd_tokenizer *t, struct json_t *root, struct json_t *model);
/* After the vocabulary is in: the unknown token (required) and the longest piece. */
int wp__resolve_vocab(servd_tokenizer *t, struct json_t *model);
/* BertNormalizer of s[0..n) appended to out. */
int wp__normalize(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_buf *out);
/* BertPreTokenizer + WordPiece of normalized text, ids appended to *out; cache: the word cache, its
 * lock held by the caller, or NULL. scratch: a buffer the call may grow. */
int wp__encode(const servd_tokenizer *t, const uint8_t *s, size_t n, word_cache *cache, tok_buf *scratch, int32_t **out,
               size_t *n_out, size_t *cap);
/* What token string s decodes to (out is reset first). */
int wp__token_bytes(const servd_tokenizer *t, const char *s, size_t n, bool in_vocab, tok_buf *out);
/* Bytes to cut from the front of the first decoded token (its added space), and in *lead the bytes
 * of the prefix to put back before it (a continuation decoded first keeps its "##"); *first: no
 * token decoded yet. */
size_t wp__lead_cut(const servd_tokenizer *t, int32_t id, const char *p, size_t pl, bool *first, size_t *lead);
/* Either normalizer (BertNormalizer, or the Prepend/Replace edits) of s[0..n) appended to out. */
int tok__normalize(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_buf *out);

/* ---- the tokenizer ------------------------------------------------------------------------------ */
typedef struct added_token {
  char *content;
  size_t len;
  /* what is looked for in the text: the content, or for a normalized token under a normalizer its
   * normalized content, as Hugging Face matches it in the normalized text (owned) */
  char *match;
  size_t match_len;
  int32_t id;
  bool special, lstrip, rstrip, single_word, normalized;
} added_token;

struct servd_tokenizer {
  /* id -> bytes (decode) */
  int32_t n_ids;       /* largest id + 1 */
  uint32_t *piece_off; /* n_ids + 1 offsets into pieces; piece_len[i] = off[i+1]-off[i] */
  uint8_t *has_piece;
  uint8_t *is_special;
  uint8_t *is_added;
  tok_buf pieces;

  str_map content_ids; /* tokenizer.json token strings and added contents -> id */
  str_map bytes_ids;   /* raw bytes of vocabulary tokens -> id (ignore_merges) */
  merge_map merges;
  int32_t byte_id[256]; /* vocabulary id of each single byte; -1 when absent */
  bool ignore_merges;

  added_token *added;
  int n_added;
  /* first-byte filter for the added-token scan */
  uint8_t added_first[256];
  pcre2_code *word_re; /* a \w character (Rust regex's Unicode \w), for single_word tokens */

  pre_step steps[8];
  int n_steps;

  int32_t *prefix_ids, *suffix_ids; /* post_processor template around the sequence */
  int n_prefix, n_suffix;

  /* character-level (SentencePiece-style) models; see spm.c */
  bool char_level;    /* symbols start as characters, not as GPT-2 byte characters */
  bool byte_fallback; /* unknown characters -> <0xXX> tokens (byte_id) */
  bool fuse_unk;
  int32_t unk_id;      /* -1: none (unknown characters are dropped) */
  uint8_t *in_vocab;   /* id is a model.vocab entry */
  uint8_t *is_bytetok; /* id is a <0xXX> token decoded as its byte */
  text_edit norm[MAX_EDITS];
  int n_norm;
  bool metaspace, meta_split;
  int meta_prepend; /* META_* */
  char meta_rep[8];
  size_t meta_rep_len;
  text_edit dec_repl[MAX_EDITS]; /* decoder Replace steps, applied to token strings */
  int n_dec_repl;
  bool dec_bytelevel, dec_bytes, dec_fused, dec_charlevel;
  int strip_left;  /* Strip decoder: leading spaces of the text to drop */
  bool meta_first; /* Metaspace decoder: the first token's leading spaces are dropped */

  /* WordPiece models (wordpiece.c) and the pair template of cross-encoders */
  bool wordpiece;
  wp_model wp;
  tok_template single, pair; /* pair.n == 0 && pair.a_at == 0: no pair template */
  bool has_pair;

  word_cache cache;
};

/* Encodes one pre-token (raw bytes) with BPE, appending ids to *out (grown as needed). */
int bpe__encode_word(const servd_tokenizer *t, const uint8_t *s, size_t n, tok_work *w, int32_t **out, size_t *n_out,
                     size_t *cap_out);
void word_cache_init(word_cache *c);
void word_cache_free(word_cache *c);
/* Returns the ids of a cached piece or NULL; lock held by the caller. */
const int32_t *word_cache_get(word_cache *c, const uint8_t *s, size_t n, int *n_ids);
void word_cache_put(word_cache *c, const uint8_t *s, size_t n, const int32_t *ids, int n_ids);

void tok_work_free(tok_work *w);

#endif
