#!/usr/bin/env bash
# Throwaway PostgreSQL clusters for pg_uvm_share's tests, demo and benchmark (any version: PG_BIN).
#
#   cluster.sh start  DIR [PORT]   rm -rf DIR, initdb DIR/data, configure, start (log in DIR/log)
#   cluster.sh stop   DIR          stop it (pg_ctl -m fast; falls back to killing the postmaster)
#   cluster.sh env    DIR          print `export PG...` lines, for eval
#   cluster.sh status DIR          exit 0 when running
#
# As root, the cluster runs as the OS user `postgres` (DIR and its parents must be
# traversable by it: keep clusters under /tmp). As anyone else, it runs as that user.
# The database superuser is the OS user running the server; authentication is `trust`,
# and the server listens only on the unix socket in DIR/sock.
#
# Environment:
#   PG_BIN           PostgreSQL binaries (default /usr/lib/postgresql/15/bin; `make PG=N` sets it
#                    to N's, e.g. a relocatable build from scripts/pg-binaries.sh, whose binaries
#                    find their libraries themselves; as root its directory must be reachable
#                    by `postgres`, which pg-binaries.sh's cache under /var/cache is)
#   UVM_EXTRA_CONF   newline-separated lines appended to postgresql.conf (pg_uvm_share.* settings)
#   UVM_PRELOAD      the value of shared_preload_libraries (default pg_uvm_share), e.g.
#                    'uvm_fake_strom, pg_uvm_share' to load another library before it (the
#                    stand-in for PG-Strom, tests/fake_strom: scripts/regress.sh's strom suites)
#   UVM_NO_PRELOAD=1 leave shared_preload_libraries out (plain PostgreSQL, to test this script)
#   UVM_START_TIMEOUT seconds pg_ctl waits for start-up (default 60)
set -euo pipefail

PG_BIN=${PG_BIN:-/usr/lib/postgresql/15/bin}
PRELOAD=${UVM_PRELOAD:-pg_uvm_share}
DEFAULT_PORT=54329
PROG=$(basename "$0")

die() { echo "$PROG: $*" >&2; exit 1; }
usage() {
  sed -n '2,8p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
}

# Absolute path without requiring DIR to exist.
abspath() {
  case "$1" in
    /*) printf '%s\n' "$1" ;;
    *) printf '%s/%s\n' "$(pwd -P)" "$1" ;;
  esac | sed -e 's#/\./#/#g' -e 's#//*#/#g' -e 's#/$##'
}

if [ "$(id -u)" = 0 ]; then
  RUN_USER=postgres
  id "$RUN_USER" >/dev/null 2>&1 || die "running as root needs the OS user 'postgres' (install postgresql-15)"
else
  RUN_USER=$(id -un)
fi

# Runs a command as the cluster's OS user, from a directory that user can enter.
as_owner() {
  local dir=$1; shift
  if [ "$(id -u)" = 0 ]; then
    (cd "$dir" && runuser -u "$RUN_USER" -- "$@")
  else
    (cd "$dir" && "$@")
  fi
}

pid_from_file() { # DATA -> pid of the postmaster (from postmaster.pid), or nothing
  local f=$1/postmaster.pid
  [ -r "$f" ] || return 0
  head -n1 "$f" 2>/dev/null | tr -dc '0-9'
}

alive_postmaster() { # DATA PID -> is PID a live postgres process for this data dir?
  local data=$1 pid=$2
  [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null || return 1
  # Guard against pid reuse: the process must be a postgres binary.
  local exe
  exe=$(readlink "/proc/$pid/exe" 2>/dev/null || true)
  case "$exe" in
    */postgres|*/postgres\ \(deleted\)) return 0 ;;
    "") return 0 ;; # cannot read (not root, other owner): trust kill -0
    *) return 1 ;;
  esac
}

cmd_stop() {
  local dir data pid i
  dir=$(abspath "$1")
  data=$dir/data
  [ -d "$data" ] || return 0
  pid=$(pid_from_file "$data")
  if [ -z "$pid" ] || ! alive_postmaster "$data" "$pid"; then
    return 0
  fi
  if as_owner "$dir" "$PG_BIN/pg_ctl" -D "$data" -m fast -w -t 30 stop >/dev/null 2>&1; then
    return 0
  fi
  echo "$PROG: pg_ctl stop failed for $data; killing postmaster $pid" >&2
  # pg_ctl starts the postmaster in its own session, so its children share its process group.
  local pgid
  pgid=$(ps -o pgid= -p "$pid" 2>/dev/null | tr -d ' ' || true)
  kill -INT "$pid" 2>/dev/null || true
  for i in $(seq 1 50); do
    kill -0 "$pid" 2>/dev/null || break
    sleep 0.2
  done
  if kill -0 "$pid" 2>/dev/null; then
    if [ -n "$pgid" ] && [ "$pgid" = "$pid" ]; then
      kill -KILL -- "-$pid" 2>/dev/null || true
    else
      kill -KILL "$pid" 2>/dev/null || true
    fi
    for i in $(seq 1 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
  fi
  kill -0 "$pid" 2>/dev/null && die "could not stop postmaster $pid"
  # Orphaned children (killed postmaster) exit on their own when they notice; nudge them.
  if [ -n "$pgid" ] && [ "$pgid" = "$pid" ]; then
    kill -KILL -- "-$pid" 2>/dev/null || true
  fi
  return 0
}

cmd_env() {
  local dir port
  dir=$(abspath "$1")
  if [ -r "$dir/cluster.env" ]; then
    cat "$dir/cluster.env"
    return 0
  fi
  [ -d "$dir/data" ] || die "no cluster in $dir"
  port=$(sed -n 's/^port *= *\([0-9]*\).*/\1/p' "$dir/data/postgresql.conf" 2>/dev/null | tail -n1)
  emit_env "$dir" "${port:-$DEFAULT_PORT}"
}

emit_env() {
  local dir=$1 port=$2
  printf 'export PGHOST=%q\n' "$dir/sock"
  printf 'export PGPORT=%q\n' "$port"
  printf 'export PGUSER=%q\n' "$RUN_USER"
  printf 'export PGDATABASE=postgres\n'
  printf 'export UVM_PGDATA=%q\n' "$dir/data"
}

cmd_status() {
  local dir pid
  dir=$(abspath "$1")
  pid=$(pid_from_file "$dir/data")
  if alive_postmaster "$dir/data" "$pid"; then
    echo "running (postmaster $pid, $dir/data)"
  else
    echo "not running ($dir)"
    return 1
  fi
}

cmd_start() {
  local dir port data sock
  dir=$(abspath "$1")
  port=${2:-$DEFAULT_PORT}
  [[ "$port" =~ ^[0-9]+$ ]] && [ "$port" -ge 1024 ] && [ "$port" -le 65535 ] || die "bad port '$port'"
  case "$dir" in
    /|/tmp|/usr|/usr/*|/etc|/etc/*|/home|/root|/var|/bin|/lib|/boot) die "refusing to use $dir" ;;
  esac
  [ -x "$PG_BIN/initdb" ] || die "no initdb in PG_BIN=$PG_BIN"
  case "$PRELOAD" in *\'* | *$'\n'*) die "UVM_PRELOAD must not hold a quote or a newline: '$PRELOAD'" ;; esac
  data=$dir/data
  sock=$dir/sock
  # unix socket paths are limited to 107 bytes
  [ $(( ${#sock} + 20 )) -lt 107 ] || die "socket path $sock/.s.PGSQL.$port is too long"

  # A cluster left running in DIR (earlier run, crashed test) goes first.
  cmd_stop "$dir"
  rm -rf "$dir" || die "cannot remove $dir"
  mkdir -p "$dir" "$sock"
  if [ "$(id -u)" = 0 ]; then
    chown -R "$RUN_USER:" "$dir"
    # Every parent must be traversable by the cluster user.
    runuser -u "$RUN_USER" -- test -x "$dir" -a -w "$dir" \
      || die "$dir is not reachable by user $RUN_USER (its parents must be traversable: use /tmp)"
  fi
  chmod 0755 "$dir"
  chmod 0700 "$sock"

  if ! as_owner "$dir" "$PG_BIN/initdb" -D "$data" -A trust -E UTF8 --locale=C.UTF-8 --no-sync \
      >"$dir/initdb.log" 2>&1; then
    # Older systems without C.UTF-8: retry with plain C.
    rm -rf "$data"
    as_owner "$dir" "$PG_BIN/initdb" -D "$data" -A trust -E UTF8 --locale=C --no-sync \
      >"$dir/initdb.log" 2>&1 || { cat "$dir/initdb.log" >&2; die "initdb failed"; }
  fi

  {
    echo ""
    echo "# --- added by scripts/cluster.sh ---"
    if [ "${UVM_NO_PRELOAD:-0}" != 1 ]; then
      echo "shared_preload_libraries = '$PRELOAD'"
    fi
    echo "listen_addresses = ''"
    echo "unix_socket_directories = '$sock'"
    echo "port = $port"
    echo "restart_after_crash = on"
    echo "max_worker_processes = 32"
    echo "max_parallel_workers_per_gather = 4"
    echo "max_parallel_workers = 16"
    echo "max_prepared_transactions = 4"
    echo "jit = off"
    echo "log_min_messages = warning"
    echo "fsync = off"
    if [ -n "${UVM_EXTRA_CONF:-}" ]; then
      echo "# UVM_EXTRA_CONF"
      printf '%s\n' "$UVM_EXTRA_CONF"
    fi
  } >>"$data/postgresql.conf"
  [ "$(id -u)" = 0 ] && chown "$RUN_USER:" "$data/postgresql.conf"

  emit_env "$dir" "$port" >"$dir/cluster.env"
  [ "$(id -u)" = 0 ] && chown "$RUN_USER:" "$dir/cluster.env"

  # The log file lives outside the data directory; created by the cluster user.
  as_owner "$dir" touch "$dir/log"
  if ! as_owner "$dir" "$PG_BIN/pg_ctl" -D "$data" -l "$dir/log" -w -t "${UVM_START_TIMEOUT:-60}" start \
      >"$dir/pg_ctl.log" 2>&1; then
    echo "$PROG: server in $dir failed to start; pg_ctl said:" >&2
    cat "$dir/pg_ctl.log" >&2 || true
    echo "$PROG: last lines of $dir/log:" >&2
    tail -n 40 "$dir/log" >&2 || true
    cmd_stop "$dir" || true
    exit 1
  fi
  echo "$PROG: started cluster in $dir (port $port, socket $sock, user $RUN_USER)"
}

[ $# -ge 2 ] || usage
cmd=$1; shift
case "$cmd" in
  start)  [ $# -le 2 ] || usage; cmd_start "$@" ;;
  stop)   [ $# -eq 1 ] || usage; cmd_stop "$1" ;;
  env)    [ $# -eq 1 ] || usage; cmd_env "$1" ;;
  status) [ $# -eq 1 ] || usage; cmd_status "$1" ;;
  *) usage ;;
esac
