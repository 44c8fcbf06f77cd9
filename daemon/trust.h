/* Startup check of --trusted-keys: the keys load (each an Ed25519 public key in PEM), so that a
 * typo or a wrong file is a configuration error at startup, not a refusal of every model later. */
#ifndef SERVD_TRUST_H
#define SERVD_TRUST_H

/* 0, logging how many keys; or 2 (the exit status of a configuration error) after printing why. */
int servd_check_trusted_keys(const char *path);

#endif
