#!/usr/bin/env bash
# Build Caddy with the Mulligan module through xcaddy (pinned), from this checkout:
#   ./xcaddy.sh            -> ./caddy
#   ./xcaddy.sh -o /usr/local/bin/caddy
# The result is a stock Caddy v2.11.9 plus http.handlers.mulligan; `./caddy list-modules | grep mulligan`.
set -euo pipefail
cd "$(dirname "$0")"
XCADDY_VERSION=v0.4.5
CADDY_VERSION=v2.11.9
out=./caddy
if [ "${1:-}" = "-o" ]; then out="$2"; fi

gobin="$(go env GOPATH)/bin"
if ! "$gobin/xcaddy" version 2>/dev/null | grep -q "${XCADDY_VERSION}"; then
	go install "github.com/caddyserver/xcaddy/cmd/xcaddy@${XCADDY_VERSION}"
fi
module=$(go list -m)
# A checkout has no published version, so Go must fall back to the local replacement when its
# module proxy does not know the module. Some proxies refuse with 403 instead of 404, which
# stops that fallback; an empty file proxy after "|" turns any refusal into "not found".
empty=$(mktemp -d)
trap 'rm -rf "$empty"' EXIT
proxies=$(go env GOPROXY | tr ",|" "\n\n" | grep -vx -e direct -e off | paste -sd "|" -)
export GOPROXY="${proxies:+$proxies|}file://$empty"
# --replace points the module at this checkout; --with imports its Caddy package.
"$gobin/xcaddy" build "$CADDY_VERSION" --output "$out" --replace "${module}=$(pwd)" --with "${module}/module"
echo "built $out"
