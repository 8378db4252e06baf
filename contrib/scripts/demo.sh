#!/bin/bash
# demo.sh — `make demo`: Cube's story through the Python SDK, run from this machine's shell.
#
# The stack runs in the test host (containerd 2.4.2, cube-snapshotter, containerd-shim-cube-v1, cube-vmm on
# nested KVM, and cube-api: `go test -run '^TestDemo$' ./integration/checkpoint` with CUBE_DEMO_PORT set), which
# forwards 127.0.0.1:PORT on this machine to cube-api (one attempt: a retried test host would wait for a client
# that already left). Here, the client a user would run:
# contrib/sdk/python/examples/demo.py (a program counting in memory, snapshot, SIGKILL, rollback in place with
# the same PID, fork 3 that diverge; each step checked and timed). Then the test host is told to finish (it
# checks that nothing the demo made is left) and powers off.
#
#   CUBE_DEMO_PORT   the machine's port for cube-api (default: a free one; PORT+1 is taken too)
#   CUBE_DEMO_FORKS  how many copies to fork (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."

die() { echo "demo: $*" >&2; exit 1; }
command -v python3 >/dev/null || die "python3 not found (apt-get install python3)"

port=${CUBE_DEMO_PORT:-$(python3 - <<'PY'
import socket
for p in range(38000, 39000, 2):
    try:
        with socket.socket() as a, socket.socket() as b:
            a.bind(("127.0.0.1", p)); b.bind(("127.0.0.1", p + 1))
        print(p); break
    except OSError:
        pass
PY
)}
[[ $port =~ ^[0-9]+$ ]] || die "no free port pair found in 38000-38999; set CUBE_DEMO_PORT"
api=http://127.0.0.1:$port
log=$(mktemp /tmp/cube-demo.XXXXXX.log)

CUBE_TESTHOST_ATTEMPTS=1 CUBE_DEMO_PORT=$port go test -count=1 -v -timeout 30m -run '^TestDemo$' ./integration/checkpoint >"$log" 2>&1 &
gt=$!
done_posted=0
finish() {
	if [[ $done_posted == 0 ]] && kill -0 "$gt" 2>/dev/null; then
		python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$((port + 1))/done', method='POST'), timeout=10)" 2>/dev/null || true
		done_posted=1
	fi
}
trap 'finish; kill "$gt" 2>/dev/null || true' INT TERM

echo "demo: starting the test host with containerd, the cube runtime and cube-api (first run builds and caches artifacts; log: $log)"
start=$(date +%s)
next=$((start + 30))
until python3 -c "import urllib.request as u; u.urlopen('$api/health', timeout=2)" 2>/dev/null; do
	if ! kill -0 "$gt" 2>/dev/null; then
		tail -40 "$log" >&2
		die "the test host ended before cube-api answered (log above, whole log in $log)"
	fi
	now=$(date +%s)
	if ((now - start > 1200)); then
		finish
		die "cube-api did not answer on $api in 20 minutes (log: $log)"
	fi
	if ((now >= next)); then
		echo "demo: still starting ($((now - start)) s): $(grep -a -E 'cube-testhost:|test host|deps:|=== RUN|ctr_test' "$log" | tail -1 | cut -c1-120)"
		next=$((now + 30))
	fi
	sleep 1
done
echo "demo: cube-api answers on $api after $(($(date +%s) - start)) s"
echo

rc=0
CUBE_API_URL=$api CUBE_API_KEY=e2e-api-key-0123456789 \
	python3 contrib/sdk/python/examples/demo.py --template docker.io/cube/e2e:latest --fork "${CUBE_DEMO_FORKS:-3}" || rc=$?
echo
finish
grc=0
wait "$gt" || grc=$?
if ((grc != 0)); then
	tail -40 "$log" >&2
	echo "demo: the test host's side failed (exit $grc; whole log in $log)" >&2
else
	echo "demo: the test host checked that nothing the demo made is left, and powered off (log: $log)"
fi
((rc == 0 && grc == 0)) || exit 1
