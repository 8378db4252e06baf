#!/bin/bash
# e2e-e2b.sh — `make e2e-e2b`: E2B's own JavaScript SDK (npm package `e2b`, unmodified) against cube-api in the
# test host: the `js` part of contrib/scripts/e2e-sdk.sh (see there; `make e2e-sdk` also runs the Python SDK's
# acceptance against the same test host).
exec bash "$(dirname "$0")/e2e-sdk.sh" js
