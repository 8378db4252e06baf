# Guest agent (issue 4): tools its tests and code generation need. Sourced by .ci/deps as root on
# Debian 12; idempotent.
#   busybox-static  container rootfs in the agent's unit tests (/bin/busybox, static)
#   e2fsprogs       mkfs.ext4 -d for the disk/freeze test
#   protobuf-compiler + protoc-gen-go + protoc-gen-go-ttrpc: `make agent-proto`, `make snapshot-proto` (shim/snapshotapi), `make proto-check` (`make vet` skips the check without them)
#   libprotobuf-dev  google/protobuf/timestamp.proto for `make envd-proto` (checkpoint/api/envdpb)
agent_pkgs=()
command -v mkfs.ext4 >/dev/null 2>&1 || agent_pkgs+=(e2fsprogs)
command -v protoc >/dev/null 2>&1 || agent_pkgs+=(protobuf-compiler)
[ -f /usr/include/google/protobuf/timestamp.proto ] || agent_pkgs+=(libprotobuf-dev)
{ ldd /bin/busybox 2>&1 || true; } | grep -q "not a dynamic" || agent_pkgs+=(busybox-static)
if [ ${#agent_pkgs[@]} -gt 0 ]; then
	apt-get update -q >/dev/null
	DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${agent_pkgs[@]}" >/dev/null
fi
# Generator versions are pinned here and documented in guest-agent/protocol/doc.go.
agent_gobin="$(go env GOPATH)/bin"
[ -x "$agent_gobin/protoc-gen-go" ] || go install google.golang.org/protobuf/cmd/protoc-gen-go@v1.36.12
[ -x "$agent_gobin/protoc-gen-go-ttrpc" ] || go install github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc@v1.2.10
unset agent_pkgs agent_gobin
