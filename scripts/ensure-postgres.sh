#!/usr/bin/env bash
# Print a PostgreSQL URL that tests and benchmarks can use, starting a server if none answers.
#
# Order: $CONVEYOR_TEST_PG if set; a server on 127.0.0.1:5432 (user postgres, trust);
# else a private cluster under .pgdata/ on port 54329, made with the machine's own
# initdb/pg_ctl (installing Debian's postgresql package when no server binaries exist).
# Progress goes to stderr; stdout is only the URL.
set -euo pipefail
cd "$(dirname "$0")/.."

log() { echo "ensure-postgres: $*" >&2; }

if [ -n "${CONVEYOR_TEST_PG:-}" ]; then echo "$CONVEYOR_TEST_PG"; exit 0; fi

probe() { # host port
  if command -v pg_isready >/dev/null 2>&1; then pg_isready -q -h "$1" -p "$2" -t 2
  else (exec 3<>"/dev/tcp/$1/$2") 2>/dev/null; fi
}

if probe 127.0.0.1 5432; then echo "postgresql://postgres@127.0.0.1:5432/postgres"; exit 0; fi

bindir=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1 || true)
if [ -z "$bindir" ] || [ ! -x "$bindir/initdb" ]; then
  log "no PostgreSQL server binaries; installing Debian's postgresql package"
  export DEBIAN_FRONTEND=noninteractive
  (apt-get update -qq && apt-get install -y -qq postgresql >/dev/null) >&2
  bindir=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
fi

port=54329
data="$PWD/.pgdata"
if probe 127.0.0.1 "$port"; then echo "postgresql://postgres@127.0.0.1:$port/postgres"; exit 0; fi

# initdb refuses to run as root: run the private cluster as an unprivileged user.
as_user=()
if [ "$(id -u)" = 0 ]; then
  user=postgres
  id "$user" >/dev/null 2>&1 || useradd --system --no-create-home "$user"
  as_user=(runuser -u "$user" --)
fi
if [ ! -f "$data/PG_VERSION" ]; then
  log "creating a private cluster in $data"
  mkdir -p "$data"
  [ "$(id -u)" = 0 ] && chown "$user" "$data"
  "${as_user[@]}" "$bindir/initdb" -D "$data" -U postgres -A trust --no-sync >/dev/null
fi
log "starting the private cluster on port $port"
mkdir -p "$data/run"
[ "$(id -u)" = 0 ] && chown "$user" "$data/run"
"${as_user[@]}" "$bindir/pg_ctl" -D "$data" -l "$data/server.log" -w -t 60 \
  -o "-p $port -k $data/run -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200" start >&2
echo "postgresql://postgres@127.0.0.1:$port/postgres"
