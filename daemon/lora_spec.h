/* servd --lora NAME=PATH[,base=MODEL]: a LoRA adapter registered at startup once its base model has
 * loaded (PATH: a PEFT folder or an adapter package; MODEL: the served language model it adapts,
 * default the only one). */
#ifndef SERVD_LORA_SPEC_H
#define SERVD_LORA_SPEC_H

typedef struct servd_lora_spec {
  char name[128];
  char path[4096];
  char base[256]; /* "": the only language model served */
} servd_lora_spec;

/* 0, or SERVD_EINVAL with a message naming the flag and what was expected. */
int servd_lora_spec_parse(const char *spec, servd_lora_spec *out);

#endif
