/* A library with TLS_PROBE_BYTES of initial-exec TLS: dlopen'ing it after startup must find that much
 * static TLS free (as a late-loaded driver library with initial-exec TLS does), or it fails with
 * "cannot allocate memory in static TLS block". test_static_tls loads copies of it to measure. */
__attribute__((tls_model("initial-exec"))) __thread char servd_tls_probe[TLS_PROBE_BYTES];

char *servd_tls_probe_touch(void) {
  servd_tls_probe[0] = 1;
  return servd_tls_probe;
}
