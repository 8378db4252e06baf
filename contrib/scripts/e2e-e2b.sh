#!/bin/bash
# e2e-e2b.sh — `make e2e-e2b`: E2B's own JavaScript SDK (npm package `e2b`, installed here at test time,
# unmodified) against cube-api in the test host, configured only through the SDK's documented settings
# (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY). contrib/sdk/e2b-compat/e2e.mjs tells the story: create a
# sandbox, run commands (output, exit codes), write/read/list files, snapshot, create a sandbox from the
# snapshot, pause/connect, fork, kill every sandbox, delete the snapshot; each step checked. Then the test
# host checks that no sandbox is left, and powers off. Exits 1 when either side failed.
#
#   CUBE_E2B_SDK_VERSION  the `e2b` package's version (default 2.51.0)
#   CUBE_E2B_SDK_DIR      where it is installed (default ~/.cache/cube/e2b-npm; npm keeps it there)
#   CUBE_DEMO_PORT        the machine's port for cube-api (default: a free one; PORT+1 is taken too)
set -euo pipefail
cd "$(dirname "$0")/../.."
. contrib/scripts/testhost-api.sh

command -v node >/dev/null || api_die e2e-e2b "node not found: the e2b package needs Node.js 20.18.1 or later (22+)"
command -v npm >/dev/null || api_die e2e-e2b "npm not found (it comes with Node.js)"
node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a >= 22 || (a === 20 && b >= 18) ? 0 : 1)' ||
	api_die e2e-e2b "node $(node --version) is too old: the e2b package needs Node.js 20.18.1 or later (22+)"
version=${CUBE_E2B_SDK_VERSION:-2.51.0}
sdk=${CUBE_E2B_SDK_DIR:-$HOME/.cache/cube/e2b-npm}
mkdir -p "$sdk"
[[ -f $sdk/package.json ]] || echo '{"name":"cube-e2b-e2e","private":true}' >"$sdk/package.json"
echo "e2e-e2b: npm install e2b@$version into $sdk"
(cd "$sdk" && npm install --no-audit --no-fund --silent "e2b@$version") || api_die e2e-e2b "npm install e2b@$version failed"
# ESM resolves `e2b` from the script's directory up: run a copy beside the package.
cp contrib/sdk/e2b-compat/e2e.mjs "$sdk/e2e.mjs"

begin=$(date +%s)
api_start e2e-e2b
api_wait e2e-e2b
echo

rc=0
(cd "$sdk" && E2B_API_URL=$api_url E2B_SANDBOX_URL=$api_url E2B_API_KEY=$api_key CUBE_E2B_TEMPLATE=$api_template \
	node e2e.mjs) || rc=$?
echo
grc=0
api_finish e2e-e2b || grc=$?
echo "e2e-e2b: $((rc == 0 && grc == 0 ? 1 : 0)) passed, $((rc == 0 && grc == 0 ? 0 : 1)) failed (wall time $(($(date +%s) - begin)) s)"
((rc == 0 && grc == 0)) || exit 1
