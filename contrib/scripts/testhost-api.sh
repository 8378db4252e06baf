# testhost-api.sh — sourced by demo.sh and e2e-sdk.sh (e2e-e2b.sh): cube-api in the test host, served to this machine.
#
# The stack runs in the test host (containerd 2.4.2, cube-snapshotter, containerd-shim-cube-v1, cube-vmm on
# nested KVM, and cube-api: `go test -run '^TestDemo$' ./integration/checkpoint` with CUBE_DEMO_PORT set), which
# forwards 127.0.0.1:PORT on this machine to cube-api (one attempt: a retried test host would wait for a client
# that already left) and PORT+1 to its "done" port. A client here drives cube-api; then api_finish tells the
# test host to finish (it checks that nothing the client made is left) and waits for it to power off.
#
#   api_start NAME      picks the port (CUBE_DEMO_PORT, or a free pair), starts the test host; sets api_port,
#                       api_url, api_key, api_template, api_log
#   api_wait NAME       waits until cube-api answers (dies naming the log when the test host ends first, or
#                       after CUBE_DEMO_WAIT seconds, default 6600; go test's own bound is CUBE_DEMO_TIMEOUT, 120m)
#   api_finish NAME     posts /done, waits for the test host; returns its exit status (log tail on failure)

api_key=e2e-api-key-0123456789
api_template=docker.io/cube/e2e:latest

api_die() { echo "$1: $2" >&2; exit 1; }

api_start() {
	command -v python3 >/dev/null || api_die "$1" "python3 not found (apt-get install python3)"
	api_port=${CUBE_DEMO_PORT:-$(python3 - <<'PY'
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
	[[ $api_port =~ ^[0-9]+$ ]] || api_die "$1" "no free port pair found in 38000-38999; set CUBE_DEMO_PORT"
	api_url=http://127.0.0.1:$api_port
	api_log=$(mktemp "/tmp/cube-$1.XXXXXX.log")
	# The time limits count the wait for the machine's test-host lock too (other test hosts may hold it).
	CUBE_TESTHOST_ATTEMPTS=1 CUBE_DEMO_PORT=$api_port go test -count=1 -v -timeout "${CUBE_DEMO_TIMEOUT:-120m}" -run '^TestDemo$' ./integration/checkpoint >"$api_log" 2>&1 &
	api_gt=$!
	api_done_posted=0
	trap 'api_post_done; kill "$api_gt" 2>/dev/null || true' INT TERM
	echo "$1: starting the test host with containerd, the cube runtime and cube-api (first run builds and caches artifacts; log: $api_log)"
}

api_post_done() {
	if [[ $api_done_posted == 0 ]] && kill -0 "$api_gt" 2>/dev/null; then
		python3 -c "import urllib.request as u; u.urlopen(u.Request('http://127.0.0.1:$((api_port + 1))/done', method='POST'), timeout=10)" 2>/dev/null || true
		api_done_posted=1
	fi
}

api_wait() {
	local start now next
	start=$(date +%s)
	next=$((start + 30))
	until python3 -c "import urllib.request as u; u.urlopen('$api_url/health', timeout=2)" 2>/dev/null; do
		if ! kill -0 "$api_gt" 2>/dev/null; then
			tail -40 "$api_log" >&2
			api_die "$1" "the test host ended before cube-api answered (log above, whole log in $api_log)"
		fi
		now=$(date +%s)
		if ((now - start > ${CUBE_DEMO_WAIT:-6600})); then
			api_post_done
			kill "$api_gt" 2>/dev/null || true
			api_die "$1" "cube-api did not answer on $api_url in ${CUBE_DEMO_WAIT:-6600} s, the wait for the test-host lock included (CUBE_DEMO_WAIT; log: $api_log)"
		fi
		if ((now >= next)); then
			echo "$1: still starting ($((now - start)) s): $(grep -a -E 'cube-testhost:|test host|deps:|=== RUN|ctr_test' "$api_log" | tail -1 | cut -c1-120)"
			next=$((now + 30))
		fi
		sleep 1
	done
	echo "$1: cube-api answers on $api_url after $(($(date +%s) - start)) s"
}

api_finish() {
	local grc=0
	api_post_done
	wait "$api_gt" || grc=$?
	if ((grc != 0)); then
		tail -40 "$api_log" >&2
		echo "$1: the test host's side failed (exit $grc; whole log in $api_log)" >&2
	else
		echo "$1: the test host checked that nothing the client made is left, and powered off (log: $api_log)"
	fi
	return "$grc"
}
