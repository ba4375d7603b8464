#!/usr/bin/env bash
# A PostgreSQL that stays up, for trying replicas on one machine (docs/operating.md, "Three
# replicas on your laptop"): the test cluster of pg-test-cluster.sh (a temporary directory,
# 127.0.0.1 on a free port, trust authentication, no Unix socket), left running.
#
#   scripts/dev-postgres.sh start   start one (or find the one running) and print its DSN
#   scripts/dev-postgres.sh dsn     print the running one's DSN
#   scripts/dev-postgres.sh stop    stop it and remove its directory
#
# What it started is kept in $MULLIGAN_DEV_POSTGRES_STATE (default ${TMPDIR:-/tmp}/mulligan-dev-postgres).
# It listens on loopback only and trusts every local user: for trying things, never for data.
set -euo pipefail
. "$(dirname "$0")/pg-test-cluster.sh"
state=${MULLIGAN_DEV_POSTGRES_STATE:-${TMPDIR:-/tmp}/mulligan-dev-postgres}

case "${1:-}" in
start)
	if [ -f "$state" ]; then
		. "$state"
		if "${PG_TEST_CLUSTER_AS[@]}" "$PG_TEST_CLUSTER_CTL" -D "$PG_TEST_CLUSTER_DIR/data" status >/dev/null 2>&1; then
			echo "$MULLIGAN_TEST_POSTGRES"
			exit 0
		fi
		rm -rf "$PG_TEST_CLUSTER_DIR" "$state" # left over from a reboot
	fi
	unset MULLIGAN_TEST_POSTGRES
	CI=true pg_test_cluster_start # its line on stderr; the DSN alone on stdout
	trap - EXIT # it stays up: stop removes it
	declare -p PG_TEST_CLUSTER_DIR PG_TEST_CLUSTER_AS PG_TEST_CLUSTER_CTL MULLIGAN_TEST_POSTGRES >"$state"
	echo "$MULLIGAN_TEST_POSTGRES"
	;;
dsn)
	[ -f "$state" ] || { echo "no PostgreSQL started by $0 start" >&2; exit 1; }
	. "$state"
	echo "$MULLIGAN_TEST_POSTGRES"
	;;
stop)
	[ -f "$state" ] || exit 0
	. "$state"
	pg_test_cluster_stop
	rm -f "$state"
	;;
*)
	echo "usage: $0 start|dsn|stop" >&2
	exit 2
	;;
esac
