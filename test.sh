#!/usr/bin/env bash
# The whole test suite: vet, formatting, every test under the race detector (real Caddy, real
# Badger, real PostgreSQL, real loopback HTTP, the built binary killed with SIGKILL), then each
# fuzz target for a few seconds on top of its seed corpus.
#
# PostgreSQL: unless MULLIGAN_TEST_POSTGRES names a cluster, a throw-away one is started for the
# run and removed after it (scripts/pg-test-cluster.sh). Without PostgreSQL binaries the tests
# that need it are skipped, saying how to install them; under CI=true the run fails instead.
set -euo pipefail
cd "$(dirname "$0")"
# shellcheck source=scripts/pg-test-cluster.sh
source scripts/pg-test-cluster.sh
pg_test_cluster_start
# A count, not a duration: go1.26's fuzz coordinator can report a spurious "context deadline
# exceeded" when a duration runs out (golang/go#75804).
fuzztime="${FUZZTIME:-5000x}"

unformatted=$(gofmt -l $(git ls-files '*.go' 2>/dev/null || find . -name '*.go'))
if [ -n "$unformatted" ]; then
	echo "gofmt would change: $unformatted" >&2
	exit 1
fi
go vet ./...

# The shipped alert rules must load in Prometheus. promtool comes with Debian's prometheus
# package: CI installs it when missing; elsewhere the check is skipped with a note.
if ! command -v promtool >/dev/null && [ "${CI:-}" = true ] && command -v apt-get >/dev/null; then
	apt-get update -qq && apt-get install -y -qq prometheus >/dev/null ||
		echo "could not install prometheus: the alert rules check is skipped" >&2
fi
if command -v promtool >/dev/null; then
	promtool check rules examples/observability/alerts.yml
else
	echo "promtool not found: skipping the alert rules check (apt-get install prometheus provides it)" >&2
fi
# The fleet tests run the replicas through PgBouncer in transaction mode (docs/backends.md):
# CI installs Debian's pgbouncer when missing (the tests start their own on a free port; the
# package's service is stopped); elsewhere they are skipped with a note.
if ! command -v pgbouncer >/dev/null && [ ! -x /usr/sbin/pgbouncer ] && [ "${CI:-}" = true ] && command -v apt-get >/dev/null; then
	apt-get update -qq && apt-get install -y -qq pgbouncer >/dev/null ||
		echo "could not install pgbouncer: the tests through it fail under CI=true" >&2
	(service pgbouncer stop || systemctl stop pgbouncer) >/dev/null 2>&1 || true
fi
# store/postgres is the longest package and waits on PostgreSQL's syncs, not the cores: it runs
# from the start beside the others (go test runs two packages at a time, in order), its output
# printed after theirs.
pglog=$(mktemp)
go test -race -count=1 -timeout 20m ./store/postgres >"$pglog" 2>&1 &
pgpid=$!
status=0
go test -race -count=1 -timeout 20m $(go list ./... | grep -v '/store/postgres$') || status=$?
wait "$pgpid" || status=$?
cat "$pglog"
rm -f "$pglog"
if [ "$status" -ne 0 ]; then
	exit "$status"
fi

for target in internal/idemkey:FuzzParseKey internal/fingerprint:FuzzFingerprint module:FuzzCaddyfile store:FuzzDecodeRecord store:FuzzDecodeOperation store:FuzzDecodeRequest internal/responses:FuzzUpstreamEvents; do
	go test -run='^$' -fuzz="^${target#*:}\$" -fuzztime="$fuzztime" "./${target%%:*}"
done
