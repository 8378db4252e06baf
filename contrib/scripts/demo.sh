#!/bin/bash
# demo.sh — `make demo`: Cube's story through the Python SDK, run from this machine's shell.
#
# cube-api runs in the test host and is forwarded to this machine (testhost-api.sh). Here, the client a user
# would run: contrib/sdk/python/examples/demo.py (a program counting in memory, snapshot, SIGKILL, rollback in
# place with the same PID, fork 3 that diverge; each step checked and timed). Then the test host is told to
# finish (it checks that nothing the demo made is left) and powers off.
#
#   CUBE_DEMO_PORT   the machine's port for cube-api (default: a free one; PORT+1 is taken too)
#   CUBE_DEMO_FORKS  how many copies to fork (default 3)
set -euo pipefail
cd "$(dirname "$0")/../.."
. contrib/scripts/testhost-api.sh

api_start demo
api_wait demo
echo

rc=0
CUBE_API_URL=$api_url CUBE_API_KEY=$api_key \
	python3 contrib/sdk/python/examples/demo.py --template "$api_template" --fork "${CUBE_DEMO_FORKS:-3}" || rc=$?
echo
grc=0
api_finish demo || grc=$?
((rc == 0 && grc == 0)) || exit 1
