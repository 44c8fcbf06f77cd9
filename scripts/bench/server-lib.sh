# Shared by the benchmark scripts that start servers (sourced, not run): waiting for readiness and
# stopping. They keep the server's PID in $pid.

# Waits until http://127.0.0.1:$1$2 answers 200 (30 s at most); else prints the log $3 and exits 1.
wait_ready() {
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$1$2" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server did not become ready:" >&2
  cat "$3" >&2
  exit 1
}

# Stops the server $pid started and forgets it.
stop() {
  kill "$pid"
  wait "$pid" 2>/dev/null || true
  pid=
}
