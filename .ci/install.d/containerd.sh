#!/bin/bash
# Installs what the snapshotter's tests need (sourced by .ci/run as root on Debian 12):
#   apt:  runc, busybox-static, xfsprogs, e2fsprogs, containernetworking-plugins (the CRI e2e pod's CNI; portmap and its
#         dependency iptables give TestCtrHookNetwork its host port),
#         criu (containerd's CRI CheckpointContainer requires a criu binary >= 3.16 even for Cube: the e2e test host gets it)
#   Go:   containerd, ctr, containerd-shim-runc-v2 at CUBE_CONTAINERD_VERSION in /usr/local/bin
#         crictl (cri-tools) at CUBE_CRICTL_VERSION in /usr/local/bin (the shim's CRI e2e test)
#         critest (cri-tools' CRI validation suite, same version) in /usr/local/bin (integration/critest)
# Idempotent: binaries already at the pinned version are not rebuilt. The build
# (1.5-3 min) goes through the Go module proxy only.
# Runs in a subshell so `set -e` and variables do not leak into the sourcing shell.
(
	set -euo pipefail
	version=${CUBE_CONTAINERD_VERSION:-v2.4.2}
	bindir=${CUBE_CONTAINERD_BINDIR:-/usr/local/bin}

	need_apt=()
	for pkg in runc busybox-static xfsprogs e2fsprogs containernetworking-plugins criu; do
		dpkg-query -W -f='${Status}' "$pkg" 2>/dev/null | grep -q "install ok installed" || need_apt+=("$pkg")
	done
	if ((${#need_apt[@]})); then
		echo "containerd.sh: apt-get install ${need_apt[*]}"
		apt-get update -qq
		DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
	fi

	have_version() { # prints nothing, exit 0 if $1 reports the pinned version
		[[ -x $1 ]] && "$1" --version 2>/dev/null | grep -q " ${version#v}\([+ ]\|$\)"
	}
	shim_ok() {
		[[ -x $bindir/containerd-shim-runc-v2 ]] &&
			"$bindir/containerd-shim-runc-v2" -v 2>/dev/null | grep -q "Version: *${version#v}"
	}
	export PATH=$PATH:/usr/local/go/bin
	tmp=$(mktemp -d)
	trap 'rm -rf "$tmp"' EXIT

	# crictl: `go install` leaves its version "unknown"; the -X flag makes
	# `crictl --version` report it, so a rerun sees it is there.
	crictl_version=${CUBE_CRICTL_VERSION:-v1.37.0}
	if [[ -x $bindir/crictl ]] && "$bindir/crictl" --version 2>/dev/null | grep -q " ${crictl_version}$"; then
		echo "containerd.sh: crictl $crictl_version already in $bindir"
	else
		echo "containerd.sh: building crictl $crictl_version (go install)"
		GOBIN=$tmp go install -ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" \
			"sigs.k8s.io/cri-tools/cmd/crictl@$crictl_version"
		install -m 0755 "$tmp/crictl" "$bindir/"
		"$bindir/crictl" --version
	fi

	# critest is cri-tools' test binary (`go test -c` of cmd/critest in the module, as its Makefile builds it);
	# the same -X makes `critest --version` report the version. (Its output is read whole: with pipefail, a
	# `| grep -q` that stops reading early can fail the pipeline by SIGPIPE and rebuild for nothing.)
	if [[ -x $bindir/critest ]] && [[ $("$bindir/critest" --version 2>/dev/null) == *"critest version: ${crictl_version}"* ]]; then
		echo "containerd.sh: critest $crictl_version already in $bindir"
	else
		echo "containerd.sh: building critest $crictl_version (go test -c in the module)"
		moddir=$(GOFLAGS=-mod=mod go mod download -json "sigs.k8s.io/cri-tools@$crictl_version" |
			sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')
		[[ -d $moddir ]] || { echo "containerd.sh: sigs.k8s.io/cri-tools@$crictl_version not downloaded" >&2; exit 1; }
		(cd "$moddir" && GOFLAGS=-buildvcs=false go test -c -o "$tmp/critest" \
			-ldflags "-X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" ./cmd/critest)
		install -m 0755 "$tmp/critest" "$bindir/"
		"$bindir/critest" --version
	fi

	if have_version "$bindir/containerd" && have_version "$bindir/ctr" && shim_ok; then
		echo "containerd.sh: containerd $version already in $bindir"
		exit 0
	fi
	echo "containerd.sh: building containerd $version (go install, takes a few minutes)"
	GOBIN=$tmp go install \
		"github.com/containerd/containerd/v2/cmd/containerd@$version" \
		"github.com/containerd/containerd/v2/cmd/ctr@$version" \
		"github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2@$version"
	install -m 0755 "$tmp/containerd" "$tmp/ctr" "$tmp/containerd-shim-runc-v2" "$bindir/"
	"$bindir/containerd" --version
)
