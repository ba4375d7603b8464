#!/usr/bin/env bash
# A throw-away PostgreSQL cluster for the tests (docs/backends.md).
#
#   scripts/pg-test-cluster.sh CMD [ARGS...]   start a cluster, run CMD with MULLIGAN_TEST_POSTGRES
#                                              set, stop and remove the cluster when CMD ends
#   source scripts/pg-test-cluster.sh          define pg_test_cluster_start (test.sh does this)
#
# Nothing starts when MULLIGAN_TEST_POSTGRES already names a cluster. The cluster lives in a
# temporary directory: initdb, 127.0.0.1 on a random free port and no Unix socket (its path would
# be too long under a deep TMPDIR; the tests use TCP), fsync and synchronous_commit on (the backend's durability is what the tests measure). Run as
# root, the server runs as the postgres user. Without PostgreSQL binaries the tests that need them
# are skipped with how to install them, and under CI=true this fails instead.

pg_test_cluster_bindir() {
	local dir
	if command -v initdb >/dev/null 2>&1 && command -v pg_ctl >/dev/null 2>&1; then
		dirname "$(command -v pg_ctl)"
		return 0
	fi
	for dir in $(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V -r); do
		if [ -x "$dir/initdb" ] && [ -x "$dir/pg_ctl" ]; then
			echo "$dir"
			return 0
		fi
	done
	return 1
}

pg_test_cluster_start() {
	if [ -n "${MULLIGAN_TEST_POSTGRES:-}" ]; then
		return 0
	fi
	local bindir
	if ! bindir=$(pg_test_cluster_bindir); then
		echo "PostgreSQL binaries (initdb, pg_ctl) not found: the PostgreSQL tests need them." >&2
		echo "Install them (Debian/Ubuntu: apt-get install postgresql) or set MULLIGAN_TEST_POSTGRES=postgres://..." >&2
		if [ "${CI:-}" = "true" ]; then
			return 1
		fi
		return 0
	fi
	PG_TEST_CLUSTER_DIR=$(mktemp -d "${TMPDIR:-/tmp}/mulligan-pg.XXXXXX")
	PG_TEST_CLUSTER_AS=()
	PG_TEST_CLUSTER_CTL="$bindir/pg_ctl"
	trap pg_test_cluster_stop EXIT # before anything can fail: the directory goes with the run
	if [ "$(id -u)" = 0 ]; then
		chown postgres: "$PG_TEST_CLUSTER_DIR" || return 1
		PG_TEST_CLUSTER_AS=(runuser -u postgres --)
	fi
	if ! "${PG_TEST_CLUSTER_AS[@]}" "$bindir/initdb" -D "$PG_TEST_CLUSTER_DIR/data" -U postgres -A trust -E UTF8 --no-sync \
		>"$PG_TEST_CLUSTER_DIR/initdb.log" 2>&1; then
		cat "$PG_TEST_CLUSTER_DIR/initdb.log" >&2
		return 1
	fi
	local port try
	for try in 1 2 3 4 5 6 7 8 9 10; do
		port=$((20000 + RANDOM % 40000))
		if (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
			continue # taken
		fi
		if "${PG_TEST_CLUSTER_AS[@]}" "$PG_TEST_CLUSTER_CTL" -D "$PG_TEST_CLUSTER_DIR/data" -l "$PG_TEST_CLUSTER_DIR/server.log" -w -t 60 \
			-o "-c listen_addresses=127.0.0.1 -p $port -c unix_socket_directories= -c fsync=on -c synchronous_commit=on -c max_connections=300" \
			start >/dev/null; then
			export MULLIGAN_TEST_POSTGRES="postgres://postgres@127.0.0.1:$port/postgres?sslmode=disable"
			echo "PostgreSQL test cluster: $MULLIGAN_TEST_POSTGRES ($PG_TEST_CLUSTER_DIR)" >&2
			return 0
		fi
	done
	cat "$PG_TEST_CLUSTER_DIR/server.log" >&2
	return 1
}

pg_test_cluster_stop() {
	if [ -n "${PG_TEST_CLUSTER_DIR:-}" ] && [ -d "$PG_TEST_CLUSTER_DIR" ]; then
		"${PG_TEST_CLUSTER_AS[@]}" "$PG_TEST_CLUSTER_CTL" -D "$PG_TEST_CLUSTER_DIR/data" -m fast -w stop >/dev/null 2>&1 || true
		rm -rf "$PG_TEST_CLUSTER_DIR"
		PG_TEST_CLUSTER_DIR=
	fi
}

if [ "${BASH_SOURCE[0]}" = "$0" ]; then
	set -euo pipefail
	if [ $# -eq 0 ]; then
		echo "usage: $0 CMD [ARGS...]" >&2
		exit 2
	fi
	pg_test_cluster_start
	# CMD runs in the background so that a TERM or INT here still stops the cluster.
	"$@" &
	child=$!
	trap 'kill "$child" 2>/dev/null; wait "$child"; exit 143' TERM INT
	status=0
	wait "$child" || status=$?
	exit "$status"
fi
