#!/bin/bash
# e2e-sdk.sh — `make e2e-sdk` (and `make test`): the SDKs from this machine's shell against cube-api in ONE test
# host (contrib/scripts/testhost-api.sh), one after the other:
#
#   js       E2B's own JavaScript SDK (npm package `e2b`, installed here at test time, unmodified), configured
#            only through the SDK's documented settings (E2B_API_URL, E2B_SANDBOX_URL, E2B_API_KEY):
#            contrib/sdk/e2b-compat/e2e.mjs — create a sandbox, commands (output, exit codes), files, snapshot,
#            create from the snapshot, pause/connect, fork, kill every sandbox, delete the snapshot.
#   python   the Python SDK's acceptance (issue 15), contrib/sdk/python/examples/acceptance.py: the worker's
#            seed probe through 3 rounds of snapshot → SIGKILL → rollback → kill → create from the snapshot
#            (counter, identity, pid, digest equal exactly), clone(4)/fork(3) diverging, a clone failing mid-fork
#            leaving nothing, 409s for a second snapshot/rollback at once, cube-api and containerd restarted
#            under running sandboxes, bad input (404/400/413/401). The worker is integration/snapshot/worker,
#            built here (static); the restarts are POSTs to the test host's control port (PORT+1).
#
# Then the test host checks that no sandbox or snapshot is left, and powers off. Exits 1 when any part or the
# test host's side failed; each part's verdict and wall time is printed.
#
#   e2e-sdk.sh [js] [python]   the parts to run (default both; `make e2e-e2b` runs js only)
#   CUBE_E2B_SDK_VERSION  the `e2b` package's version (default 2.51.0)
#   CUBE_E2B_SDK_DIR      where it is installed (default ~/.cache/cube/e2b-npm; npm keeps it there)
#   CUBE_DEMO_PORT        the machine's port for cube-api (default: a free one; PORT+1 is taken too)
set -euo pipefail
cd "$(dirname "$0")/../.."
. contrib/scripts/testhost-api.sh

parts=("$@")
((${#parts[@]})) || parts=(js python)
run_js=0 run_py=0
for p in "${parts[@]}"; do
	case $p in
	js) run_js=1 ;;
	python) run_py=1 ;;
	*) api_die e2e-sdk "unknown part $p: want js and/or python" ;;
	esac
done

if ((run_js)); then
	command -v node >/dev/null || api_die e2e-sdk "node not found: the e2b package needs Node.js 20.18.1 or later (22+)"
	command -v npm >/dev/null || api_die e2e-sdk "npm not found (it comes with Node.js)"
	node -e 'const [a, b] = process.versions.node.split(".").map(Number); process.exit(a >= 22 || (a === 20 && b >= 18) ? 0 : 1)' ||
		api_die e2e-sdk "node $(node --version) is too old: the e2b package needs Node.js 20.18.1 or later (22+)"
	version=${CUBE_E2B_SDK_VERSION:-2.51.0}
	sdk=${CUBE_E2B_SDK_DIR:-$HOME/.cache/cube/e2b-npm}
	mkdir -p "$sdk"
	[[ -f $sdk/package.json ]] || echo '{"name":"cube-e2b-e2e","private":true}' >"$sdk/package.json"
	echo "e2e-sdk: npm install e2b@$version into $sdk"
	(cd "$sdk" && npm install --no-audit --no-fund --silent "e2b@$version") || api_die e2e-sdk "npm install e2b@$version failed"
	# ESM resolves `e2b` from the script's directory up: run a copy beside the package.
	cp contrib/sdk/e2b-compat/e2e.mjs "$sdk/e2e.mjs"
fi
if ((run_py)); then
	worker_dir=$(mktemp -d /tmp/cube-e2e-sdk-worker.XXXXXX)
	trap 'rm -rf "$worker_dir"' EXIT
	echo "e2e-sdk: building the worker (integration/snapshot/worker, static) for the Python acceptance"
	CGO_ENABLED=0 go build -o "$worker_dir/worker" ./integration/snapshot/worker || api_die e2e-sdk "go build ./integration/snapshot/worker failed"
fi

begin=$(date +%s)
api_start e2e-sdk
api_wait e2e-sdk
echo

verdicts=() failed=0
if ((run_js)); then
	t=$(date +%s) rc=0
	(cd "$sdk" && E2B_API_URL=$api_url E2B_SANDBOX_URL=$api_url E2B_API_KEY=$api_key CUBE_E2B_TEMPLATE=$api_template \
		node e2e.mjs) || rc=$?
	verdicts+=("js (E2B's SDK): $( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t)) s")
	((rc == 0)) || failed=1
	echo
fi
if ((run_py)); then
	t=$(date +%s) rc=0
	CUBE_API_URL=$api_url CUBE_API_KEY=$api_key CUBE_TEMPLATE_ID=$api_template CUBE_WORKER_BIN=$worker_dir/worker \
		CUBE_ACCEPTANCE_CONTROL_URL=http://127.0.0.1:$((api_port + 1)) \
		python3 contrib/sdk/python/examples/acceptance.py || rc=$?
	verdicts+=("python (acceptance): $( ((rc == 0)) && echo passed || echo "FAILED (exit $rc)") in $(($(date +%s) - t)) s")
	((rc == 0)) || failed=1
	echo
fi
grc=0
api_finish e2e-sdk || grc=$?
verdicts+=("test host (nothing left): $( ((grc == 0)) && echo passed || echo "FAILED (exit $grc)")")
((grc == 0)) || failed=1
for v in "${verdicts[@]}"; do echo "e2e-sdk: $v"; done
echo "e2e-sdk: $( ((failed)) && echo FAILED || echo passed) (wall time $(($(date +%s) - begin)) s)"
((failed == 0)) || exit 1
