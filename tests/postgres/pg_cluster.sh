#!/bin/sh
# tests/postgres/pg_cluster.sh: a throwaway PostgreSQL cluster for the
# postgres plugin's tests.
#
#   pg_cluster.sh start DIR    initdb into DIR/data, start it on 127.0.0.1 at a
#                              free port, write the connection URI to DIR/uri
#                              (and print it)
#   pg_cluster.sh stop DIR     stop it (pg_ctl -m fast) and remove DIR
#   pg_cluster.sh down DIR     stop the server but keep DIR (an outage)
#   pg_cluster.sh up DIR       start it again on the same port
#   pg_cluster.sh restart DIR  pg_ctl restart -m fast (same port)
#
# The server listens on 127.0.0.1 only (no Unix socket), with fsync on. Auth:
# trust for every role from 127.0.0.1, except the role tnx_pw_user (password
# "tnx-Secret-pw-4711", scram-sha-256, owner of the schema of its name, where
# its tables go), which the tests use to check that passwords never reach an
# error message.
#
# Run as root, initdb and the server run as the "postgres" system user (made
# by the postgresql package) through runuser, and DIR is chowned to it; run as
# anyone else, they run as that user. The superuser role is named after that
# user. PostgreSQL binaries: $PG_BINDIR, else the newest
# /usr/lib/postgresql/*/bin.
#
# Needs: postgresql (server binaries; Debian: apt-get install postgresql).
set -eu

usage() { echo "usage: $0 start|stop|down|up|restart DIR" >&2; exit 2; }
[ $# -eq 2 ] || usage
cmd=$1
dir=$2
case $dir in /*) ;; *) dir=$(pwd)/$dir ;; esac

bindir=${PG_BINDIR:-}
if [ -z "$bindir" ]; then
  for d in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V); do
    [ -x "$d/pg_ctl" ] && bindir=$d
  done
fi
if [ -z "$bindir" ] || [ ! -x "$bindir/pg_ctl" ]; then
  echo "pg_cluster.sh: no PostgreSQL server binaries (install the postgresql package or set PG_BINDIR)" >&2
  exit 1
fi

if [ "$(id -u)" = 0 ]; then
  pguser=postgres
  as_pg() { runuser -u postgres -- "$@"; }
else
  pguser=$(id -un)
  as_pg() { "$@"; }
fi

# The server's files live in DIR, or, when the server's user cannot reach DIR
# (a build tree under /root), in a directory under /tmp named by DIR/pgbase.
base=$dir
[ -f "$dir/pgbase" ] && base=$(cat "$dir/pgbase")
data=$base/data
log=$base/server.log

# pg_ctl start on the port in DIR/port; fails when the port is taken.
start_server() {
  as_pg "$bindir/pg_ctl" start -D "$data" -l "$log" -w -t 30 -s -o "-p $(cat "$dir/port")"
}

# A TCP port nobody listens on now (the kernel's choice).
free_port() {
  python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])' 2>/dev/null ||
    echo $((20000 + $(od -An -N2 -tu2 /dev/urandom) % 40000))
}

case $cmd in
start)
  # A leftover from an aborted run: stop it, then start from scratch.
  if [ -f "$data/postmaster.pid" ]; then
    as_pg "$bindir/pg_ctl" stop -D "$data" -m immediate -s >/dev/null 2>&1 || true
  fi
  [ "$base" != "$dir" ] && rm -rf "$base"
  rm -rf "$dir"
  mkdir -p "$dir"
  base=$dir
  [ "$(id -u)" = 0 ] && chown postgres: "$dir"
  if ! as_pg test -w "$dir"; then
    base=$(mktemp -d /tmp/tnx-pg-XXXXXX)
    [ "$(id -u)" = 0 ] && chown postgres: "$base"
    echo "$base" >"$dir/pgbase"
  fi
  data=$base/data
  log=$base/server.log
  # --no-sync: initdb's own files need no fsync for a throwaway cluster; the
  # server itself runs with fsync on.
  as_pg "$bindir/initdb" -D "$data" -E UTF8 --locale=C -A trust --no-sync -U "$pguser" >"$dir/initdb.log" 2>&1 || {
    cat "$dir/initdb.log" >&2
    exit 1
  }
  as_pg sh -c "cat >> '$data/postgresql.conf'" <<'EOF'
# pg_cluster.sh
listen_addresses = '127.0.0.1'
unix_socket_directories = ''
fsync = on
synchronous_commit = on
max_connections = 200
shared_buffers = 32MB
EOF
  as_pg sh -c "cat > '$data/pg_hba.conf'" <<'EOF'
# pg_cluster.sh: loopback only.
host all tnx_pw_user 127.0.0.1/32 scram-sha-256
host all all 127.0.0.1/32 trust
EOF
  ok=
  for attempt in 1 2 3 4 5 6 7 8; do
    free_port >"$dir/port"
    if start_server 2>>"$dir/start.log"; then
      ok=1
      break
    fi
    # Port taken between the check and the bind: try another.
    as_pg "$bindir/pg_ctl" stop -D "$data" -m immediate -s >/dev/null 2>&1 || true
  done
  if [ -z "$ok" ]; then
    echo "pg_cluster.sh: the server did not start; log:" >&2
    tail -n 30 "$log" >&2 || true
    exit 1
  fi
  port=$(cat "$dir/port")
  uri="postgresql://$pguser@127.0.0.1:$port/postgres?sslmode=disable"
  "$bindir/psql" -X -q -v ON_ERROR_STOP=1 "$uri" \
    -c "CREATE ROLE tnx_pw_user LOGIN PASSWORD 'tnx-Secret-pw-4711'" \
    -c "CREATE SCHEMA tnx_pw_user AUTHORIZATION tnx_pw_user" >/dev/null
  echo "$uri" >"$dir/uri"
  echo "$uri"
  ;;
stop)
  if [ -f "$data/postmaster.pid" ]; then
    as_pg "$bindir/pg_ctl" stop -D "$data" -m fast -w -t 30 -s ||
      as_pg "$bindir/pg_ctl" stop -D "$data" -m immediate -s || true
  fi
  [ "$base" != "$dir" ] && rm -rf "$base"
  rm -rf "$dir"
  ;;
down)
  as_pg "$bindir/pg_ctl" stop -D "$data" -m fast -w -t 30 -s
  ;;
up)
  start_server
  ;;
restart)
  as_pg "$bindir/pg_ctl" restart -D "$data" -m fast -w -t 30 -s -l "$log" -o "-p $(cat "$dir/port")"
  ;;
*)
  usage
  ;;
esac
