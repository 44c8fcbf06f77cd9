/* BPE tokenizer read from a Hugging Face tokenizer.json: byte-level (GPT-2, Llama 3, SmolLM2) or
 * SentencePiece-style with byte fallback (Llama 2, TinyLlama, Mistral 7B v0.1); and WordPiece (BERT
 * and its descendants: MiniLM, bge, e5, gte).
 *
 * Supported tokenizer.json subset (anything else is refused with a message naming the field):
 *   model:          {"type": "BPE", "vocab": {token: id}, "merges": ["a b", ...] or [["a", "b"], ...],
 *                    "ignore_merges": bool, "byte_fallback": bool, "fuse_unk": bool, "unk_token",
 *                    "dropout": null}
 *   added_tokens:   [{"id", "content", "special", "lstrip", "rstrip", "single_word", "normalized"}]
 *                   split out of the text before anything else (leftmost, then longest match);
 *                   "normalized" ones after the normalizer, as their normalized content (and
 *                   decoded from it, as Hugging Face does).
 *   normalizer:     null | Prepend | Replace{pattern: {String}} | Sequence of these
 *   pre_tokenizer:  ByteLevel{add_prefix_space, use_regex} | Digits{individual_digits}
 *                   | Split{pattern: {Regex|String}, behavior: Isolated|Removed|MergedWithPrevious|
 *                     MergedWithNext|Contiguous, invert: false} | Sequence of these
 *                   | Metaspace{replacement, prepend_scheme always|first|never (or add_prefix_space),
 *                     split} (alone)
 *   post_processor: null | ByteLevel | TemplateProcessing (single, pair) | BertProcessing | Sequence of these
 *   decoder:        null | ByteLevel | Sequence of ByteLevel
 *                   | Sequence of Replace{String}, ByteFallback, Fuse, Strip{" ", start, stop 0}, Metaspace
 * WordPiece models ({"type": "WordPiece", "vocab", "unk_token", "continuing_subword_prefix",
 * "max_input_chars_per_word"}) take normalizer BertNormalizer{clean_text, handle_chinese_chars,
 * strip_accents, lowercase} or null, pre_tokenizer BertPreTokenizer or null and decoder WordPiece or
 * null (its cleanup glues . , ? ! to the word before; the other cleanup rules are not applied).
 * Byte-level tokenizers BPE the bytes of each pre-token (the ByteLevel alphabet); the others
 * ("character-level": byte_fallback, a normalizer, Metaspace or one of those decoders, never with
 * ByteLevel) start from characters, spell a character outside the vocabulary as its <0xXX> tokens
 * (byte_fallback) or the unknown token, and decode <0xXX> to its byte, the metaspace to a space, and
 * drop the leading space as Strip / the Metaspace decoder say (for the whole text, also when it is
 * streamed). Where a run of <0xXX> tokens is not valid UTF-8, Hugging Face's ByteFallback decoder
 * turns each of its bytes into U+FFFD; here, as for byte-level tokenizers, each maximal invalid
 * subpart becomes one U+FFFD, so streamed text need not wait for the end of a run.
 * A top-level or model-level "pre" string (written for packages converted from GGUF, the value of
 * tokenizer.ggml.pre) overrides pre_tokenizer with llama.cpp's behaviour for that name:
 *   "smollm": every digit alone, then the GPT-2 pattern; "gpt2"/"gpt-2": the GPT-2 pattern;
 *   "llama3"/"llama-bpe"/"llama-v3": the Llama 3 pattern; "default": llama.cpp's default BPE split.
 *
 * Encoding input that is not valid UTF-8 is first made valid the way Rust's String::from_utf8_lossy
 * and Python's bytes.decode(errors="replace") do (each maximal invalid subpart becomes U+FFFD).
 * Decoding concatenates the tokens' bytes and replaces invalid UTF-8 the same way.
 *
 * A servd_tokenizer is immutable after loading except for an internal word cache guarded by a lock;
 * all functions below may be called from several threads at once.
 */
#ifndef SERVD_TOKENIZER_H
#define SERVD_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "servd/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct servd_tokenizer servd_tokenizer;

/* Parses tokenizer.json from memory (json need not be NUL-terminated; nothing of it is kept).
 * *out is owned by the caller (servd_tokenizer_free). */
SERVD_API int servd_tokenizer_load(const char *json, size_t len, servd_tokenizer **out);
SERVD_API int servd_tokenizer_load_file(const char *path, servd_tokenizer **out);
SERVD_API void servd_tokenizer_free(servd_tokenizer *t); /* accepts NULL */

/* Text -> ids. add_special: add what the post_processor template adds (BOS for Llama 3, nothing for
 * SmolLM2 or GPT-2). *ids is malloc'd, the caller frees it; *n is its length. */
SERVD_API int servd_tokenizer_encode(const servd_tokenizer *t, const char *text, size_t len, bool add_special,
                                     int32_t **ids, int *n);

/* A pair of texts (cross-encoders: query and document) through the post_processor's pair template,
 * [CLS] a [SEP] b [SEP] for BERT. type_ids (may be NULL) receives each token's segment id (BERT's
 * token_type_ids). max_len > 0: the two texts' tokens are cut LongestFirst (the longer loses its last
 * token until all fits, as Hugging Face truncates pairs) so that the result has at most max_len ids;
 * SERVD_ERANGE when the template's specials leave no room. SERVD_EUNSUPPORTED without a pair
 * template. *ids and *type_ids are malloc'd, the caller frees them. */
SERVD_API int servd_tokenizer_encode_pair(const servd_tokenizer *t, const char *a, size_t alen, const char *b,
                                          size_t blen, int max_len, int32_t **ids, int32_t **type_ids, int *n);
SERVD_API bool servd_tokenizer_has_pair_template(const servd_tokenizer *t);

/* The ids add_special puts before and after the text (borrowed, valid while t lives; counts may be
 * 0), e.g. to avoid a second BOS when a rendered chat template already starts with one. */
SERVD_API void servd_tokenizer_special_affixes(const servd_tokenizer *t, const int32_t **prefix, int *n_prefix,
                                               const int32_t **suffix, int *n_suffix);

/* Ids -> text (UTF-8, NUL-terminated; *len excludes the NUL; len may be NULL). Special tokens are
 * rendered as their content unless skip_special. *text is malloc'd, the caller frees it. */
SERVD_API int servd_tokenizer_decode(const servd_tokenizer *t, const int32_t *ids, int n, bool skip_special,
                                     char **text, size_t *len);

/* The raw bytes a token stands for (may be a partial UTF-8 sequence). Borrowed, valid while t lives;
 * NULL for an id out of range or without a token. */
SERVD_API const char *servd_tokenizer_token_to_piece(const servd_tokenizer *t, int32_t id, size_t *len);

/* Largest id + 1 over the vocabulary and the added tokens. */
SERVD_API int servd_tokenizer_vocab_size(const servd_tokenizer *t);

/* Id of the added token or vocabulary entry whose content is exactly `content` (as written in
 * tokenizer.json, e.g. "<|im_end|>"); -1 when there is none. */
SERVD_API int32_t servd_tokenizer_token_id(const servd_tokenizer *t, const char *content);

/* True for added tokens marked "special". */
SERVD_API bool servd_tokenizer_is_special(const servd_tokenizer *t, int32_t id);

/* ---- incremental detokenization ------------------------------------------------------------------
 * Feeding ids one at a time yields text deltas whose concatenation equals servd_tokenizer_decode of
 * all ids: a delta never ends inside a UTF-8 sequence (incomplete trailing bytes are held back until
 * the sequence completes or proves invalid, then U+FFFD). No allocation per token once the internal
 * buffer has grown to the longest token. */
typedef struct servd_detok servd_detok;

/* t is borrowed and must outlive the detokenizer, which the caller owns (servd_detok_free). */
SERVD_API int servd_detok_create(const servd_tokenizer *t, bool skip_special, servd_detok **out);
SERVD_API void servd_detok_free(servd_detok *d); /* accepts NULL */
SERVD_API void servd_detok_reset(servd_detok *d);
/* Feeds one id; text and len receive the delta (borrowed, valid until the next call on d; may be
 * empty). Unknown ids are SERVD_ERANGE. */
SERVD_API int servd_detok_push(servd_detok *d, int32_t id, const char **text, size_t *len);
/* End of stream: held-back bytes of an incomplete sequence become U+FFFD. */
SERVD_API int servd_detok_flush(servd_detok *d, const char **text, size_t *len);

#ifdef __cplusplus
}
#endif
#endif
