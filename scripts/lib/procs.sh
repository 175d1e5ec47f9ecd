# scripts/lib/procs.sh: start the servers of a demo or benchmark script on
# ports no other run can hold, and know that what answers is what the script
# started. Source it (bash); it appends every pid it starts to the array
# `pids`, which the script kills on exit.
#
# The rule: every server listens on port 0 (the kernel picks a free port and
# gives it to that one socket) and prints the address it bound (router serve:
# "router serve listening on http://ADDR", mock-worker: "mock-worker
# listening on http://ADDR" and "mock-worker rank R KV events on tcp://ADDR",
# nats-server: "Listening for client connections on ADDR"). The address is
# read from the started process's own output, so it is that process's socket
# for as long as the process lives: two runs at once get different ports, and
# a run never talks to another run's server. alive_or_fail checks the
# processes are still running before their figures are read. A server that
# cannot take port 0 (HAProxy's configuration names its ports) gets a port
# from free_port, and when it is taken anyway, port_owner names who holds it.

# start_listening NAME LOG REGEX CMD...: runs CMD in the background with
# stdout and stderr to LOG, records its pid in `pids` and `started_pid`, and
# waits (15 s at most) for a line of LOG matching the extended regular
# expression REGEX; its first group goes to `started_addr`. When CMD exits
# first, or no line comes, it prints LOG and exits 1, naming the owner of a
# port its bind found taken.
start_listening() {
  local name=$1 log=$2 re=$3
  shift 3
  "$@" >"$log" 2>&1 &
  started_pid=$!
  pids+=("$started_pid")
  local line
  for _ in $(seq 300); do
    while IFS= read -r line; do
      if [[ $line =~ $re ]]; then
        started_addr=${BASH_REMATCH[1]}
        return 0
      fi
    done <"$log"
    if ! kill -0 "$started_pid" 2>/dev/null; then
      echo "$name (pid $started_pid) exited before listening; its output:" >&2
      sed 's/^/  /' "$log" >&2
      local taken
      taken=$(grep -oE '[0-9.]+:[0-9]+: bind: address already in use' "$log" | head -1) || true
      if [ -n "$taken" ]; then
        taken=${taken%%: bind*}
        echo "port ${taken##*:} is held by $(port_owner "${taken##*:}")" >&2
      fi
      exit 1
    fi
    sleep 0.05
  done
  echo "$name (pid $started_pid) printed no address matching '$re' within 15 s; its output:" >&2
  sed 's/^/  /' "$log" >&2
  exit 1
}

# alive_or_fail NAME PID...: exits 1, naming NAME and the pid, when one of
# the processes is no longer running (its port could then be anyone's).
alive_or_fail() {
  local name=$1
  shift
  local p
  for p in "$@"; do
    if ! kill -0 "$p" 2>/dev/null; then
      echo "$name (pid $p) is no longer running: its figures would not be this run's" >&2
      exit 1
    fi
  done
}

# port_owner PORT: who listens on TCP PORT, as "NAME (pid N)" from ss when it
# can tell (processes of other users show no pid without root), else
# "another process".
port_owner() {
  local out
  out=$(ss -Hltnp "sport = :$1" 2>/dev/null | grep -o 'users:((.*))' | head -1) || true
  if [[ $out =~ \(\"([^\"]+)\",pid=([0-9]+) ]]; then
    echo "${BASH_REMATCH[1]} (pid ${BASH_REMATCH[2]})"
  else
    echo "another process"
  fi
}

# port_in_use PORT: whether something accepts connections on 127.0.0.1:PORT.
port_in_use() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

# free_port: prints a loopback TCP port nothing listens on now, from the
# range 20000-32767 (below Linux's default ephemeral range, 32768-60999, so
# outgoing connections do not take it meanwhile). For servers that cannot
# listen on port 0; between this check and their bind another process may
# take it, and the server's bind error (with port_owner) then says so.
free_port() {
  local p
  for _ in $(seq 100); do
    p=$((20000 + RANDOM % 12768))
    if ! port_in_use "$p"; then
      echo "$p"
      return 0
    fi
  done
  echo "free_port: no free port found in 100 tries" >&2
  return 1
}
