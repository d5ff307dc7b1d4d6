# Shared by deploy/ha/up, roll and down: where everything lives, the ports,
# and how a process is started, awaited and recognised. Sourced, not run.

HA_DIR=${HA_DIR:-/tmp/counter-ha}
HA_PORT_BASE=${HA_PORT_BASE:-17000}

die() { echo "deploy/ha/$(basename "$0"): $*" >&2; exit 1; }

# Ports: etcd base+0/1, PostgreSQL base+10.., Patroni's REST API base+20..,
# HAProxy's PostgreSQL fronts base+30/31, PgBouncer base+35, HAProxy's stats
# base+39, the service front base+40, Redis base+50.., its Sentinels
# base+60.., the instances base+70.. (all below
# base+100, and below the ephemeral range for any base up to 32600).
pg_port() { echo $((HA_PORT_BASE + 10 + $1)); }
rest_port() { echo $((HA_PORT_BASE + 20 + $1)); }
service_port() { echo $((HA_PORT_BASE + 70 + $1)); }
redis_port() { echo $((HA_PORT_BASE + 50 + $1)); }
sentinel_port() { echo $((HA_PORT_BASE + 60 + $1)); }
ha_stats_port() { echo $((HA_PORT_BASE + 39)); }

# Starts "$@" in its own session, its output appended to log/$name, its pid
# in pids/$name.
start() {
  local name=$1; shift
  setsid "$@" >>"$HA_DIR/log/$name" 2>&1 </dev/null &
  echo $! >"$HA_DIR/pids/$name"
}

# Waits up to $2 seconds for the command "${@:3}" to succeed; $1 names it.
await() {
  local what=$1 seconds=$2; shift 2
  local deadline=$((SECONDS + seconds))
  until "$@" >/dev/null 2>&1; do
    ((SECONDS < deadline)) || die "$what: not up after ${seconds} s (logs in $HA_DIR/log)"
    sleep 0.2
  done
}

# The service binary: $COUNTER_SERVICE_BIN, counter-service on PATH, or this
# checkout's release then debug build.
service_bin() {
  local here bin=${COUNTER_SERVICE_BIN:-$(command -v counter-service || true)}
  here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
  for candidate in "$here/../../target/release/counter-service" "$here/../../target/debug/counter-service"; do
    [[ -n $bin ]] || { [[ -x $candidate ]] && bin=$candidate; } || true
  done
  [[ -x ${bin:-} ]] || die "no counter-service binary: set COUNTER_SERVICE_BIN or build it"
  echo "$bin"
}

# Starts instance $1 of the service (binary $2) and waits for its /readyz.
start_service() {
  local i=$1 bin=$2
  RUST_LOG=${RUST_LOG:-info} start "service$i" "$bin" --config "$HA_DIR/counter-service.toml" \
    --listen "127.0.0.1:$(service_port "$i")" serve
}

# HAProxy's view of server $2 of proxy $1: UP, DOWN, MAINT...
haproxy_status() {
  curl -sf "http://127.0.0.1:$(ha_stats_port)/;csv" | awk -F, -v p="$1" -v s="$2" '$1 == p && $2 == s { print $18 }'
}
