# Cube — common tasks. `make help` lists them.
GO        ?= go
BIN       := bin
# e2e tier: which packages and tests (e.g. make e2e E2E_PKGS=./integration/kvm RUN=TestSmoke).
E2E_PKGS  ?= $(shell $(GO) list ./integration/...)
RUN       ?= .
# bench: which packages and benchmarks
BENCH_PKGS ?= ./...
BENCH     ?= .
# fuzz: how long each fuzz target runs, in every fuzz target (fuzz-devices: DEVICE_FUZZTIME, by default this).
FUZZTIME  ?= 30s
export GOFLAGS ?= -buildvcs=false

.PHONY: help deps build guest test test-unit test-full e2e bench demo e2e-e2b e2e-sdk fuzz vet proto-check clean stress

help:
	@echo "make demo       the SDK story from this shell: Python SDK → cube-api in the test host → containerd → microVMs (snapshot, rollback, fork)"
	@echo "make e2e-sdk    the SDKs → cube-api in one test host: E2B's own JS SDK (npm e2b, unmodified), then the Python SDK's acceptance (rollback/restore rounds, clone/fork, 409s, restarts, bad input)"
	@echo "make e2e-e2b    E2B's own JS SDK only (e2e-sdk's js part): sandboxes, commands, files, snapshots, fork"
	@echo "make test       all tiers: unit, host /dev/kvm, and end-to-end in the test host"
	@echo "make test-unit  unit and host-KVM tiers only (go test -short)"
	@echo "make test-full  all non-e2e tests, incl. root ones (snapshotter suites, containerd daemon)"
	@echo "make e2e        test host tier; select with E2E_PKGS=... RUN=..."
	@echo "make bench      benchmarks (BENCH_PKGS=..., BENCH=...)"
	@echo "make bench-net  TCP throughput and round trips: cube-vmm's virtio-net vs QEMU's vs a runc container (test host)"
	@echo "make critest    cri-tools' CRI validation suite (critest v1.37.0), all of it, runc vs --runtime-handler cube (test host)"
	@echo "make stress     test-host stability: CUBE_STRESS_LIFECYCLES nested VM lifecycles (default 50), failures counted"
	@echo "make build      binaries into bin/"
	@echo "make guest      guest image into bin/guest (kernel + agent initramfs)"
	@echo "make fuzz       every fuzz target in turn (FUZZTIME=30s each)"
	@echo "make vet        go vet, gofmt, and the generated protocol code (agent, shim snapshot service) against its .proto"
	@echo "make deps       install missing Debian packages and tools (as root)"

deps:
	@bash .ci/deps

# Static binaries: the agent runs in an initramfs without libc, and static ones copy anywhere.
build:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/ ./cmd/...

# The sandbox guest image: bin/guest/vmlinuz (pinned Debian cloud kernel) and bin/guest/initramfs.cpio.gz
# (/init = the guest agent, plus the modules it loads).
guest: agent
	$(GO) run ./cmd/cube-guestimage -agent $(BIN)/cube-agent -out $(BIN)/guest

# Also checks the generated protocol code (guest-agent/protocol, shim/snapshotapi) against its .proto (skipped, with
# the reason, where the pinned generators are not installed; `make proto-check` insists).
vet:
	$(GO) vet ./...
	@test -z "$$(gofmt -l .)" || { echo "gofmt needed:"; gofmt -l .; exit 1; }
	@GO='$(GO)' bash .ci/proto-check --if-available

# Fails if guest-agent/protocol/*.pb.go or shim/snapshotapi/*.pb.go differ from what agent.proto and
# snapshot.proto produce (regenerated in a temporary directory; needs the pinned protoc, protoc-gen-go,
# protoc-gen-go-ttrpc).
proto-check:
	@GO='$(GO)' bash .ci/proto-check

# Regenerate shim/snapshotapi/*.pb.go, the shim's snapshot service cube.snapshot.v1 (the generators of
# agent-proto, same pinned versions).
.PHONY: snapshot-proto
snapshot-proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" $(GO) generate ./shim/snapshotapi

# Regenerate checkpoint/api/envdpb/*/*.pb.go, E2B's envd messages cube-api serves (protoc-gen-go only; Debian's
# libprotobuf-dev for google/protobuf/timestamp.proto).
.PHONY: envd-proto
envd-proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" $(GO) generate ./checkpoint/api/envdpb

# Regenerate shim/filesapi/*.pb.go, the shim's files service cube.files.v1 (same generators).
.PHONY: files-proto
files-proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" $(GO) generate ./shim/filesapi

# Unit tier (no root, no KVM) and host-KVM tier (tiny synthetic guests on this machine's /dev/kvm; those tests
# skip with a message when it is absent or PVM, and run for real inside the test host: integration/kvm builds
# the hypervisor packages' test binaries and runs them there, failing on such a skip). -short keeps the test
# host and the slow root tests out.
test-unit: vet
	$(GO) test -short -count=1 ./...

# Everything outside integration/ in full: as root this includes containerd's snapshotter suite on an XFS
# loop pool, the real containerd daemon test, loop-device and namespace tests. -p 1: they share loop
# devices, mounts and cgroups.
NON_E2E_PKGS = $(shell $(GO) list ./... | grep -v /integration/)

test-full: vet
	$(GO) test -count=1 -p 1 $(NON_E2E_PKGS)

# Test host tier: each package boots one QEMU test host of 1 vCPU (integration/testhost, DefaultCPUs); packages
# run E2E_P at a time (default: one per core), and the test hosts' machine lock gives each vCPU a core of its
# own, so a 2-vCPU test host (CUBE_TESTHOST_SMP=2) waits for both.
E2E_P     ?= $(shell nproc 2>/dev/null || echo 1)
e2e: deps
	$(GO) test -count=1 -p $(E2E_P) -timeout 60m -v -run '$(RUN)' $(E2E_PKGS)

# The e2e tier runs first, on a machine nothing else has touched yet (under QEMU 7.2, nested guests froze test
# hosts more often after the root tier had run; kept as a cheap precaution). E2B's own JS SDK (e2e-sdk's js part)
# closes the e2e tier: it runs from this machine's shell against cube-api in a test host of its own. The Python
# SDK's acceptance (`make e2e-sdk`, passing; docs/api.md, "The acceptance") is not in it: its 15 minutes would
# take CI past its 45.
test: deps vet build
	$(GO) test -count=1 -p $(E2E_P) -timeout 60m -v $(E2E_PKGS)
	bash contrib/scripts/e2e-sdk.sh js
	$(GO) test -count=1 -p 1 $(NON_E2E_PKGS)

# Test-host stability (opt-in: `make test` runs only the package's unit tests): nested VM lifecycles in test
# hosts, one line of figures at the end; the platform comes from CUBE_TESTHOST_* (integration/testhost/platform.go).
stress: deps
	CUBE_STRESS_LIFECYCLES=$${CUBE_STRESS_LIFECYCLES:-50} $(GO) test -count=1 -timeout 600m -v ./integration/testhost/stress

bench: deps
	$(GO) test -run '^$$' -bench '$(BENCH)' -benchmem $(BENCH_PKGS)

# The main job, as a user meets it: in the test host (nested KVM: this machine has no usable /dev/kvm),
# containerd 2.4.2 with cube-snapshotter and io.cube.v1 under cube-api, reached from this machine's shell through
# a forwarded port by the Python SDK's demo (contrib/sdk/python/examples/demo.py): a program counting in memory,
# snapshot, SIGKILL, rollback in place (same PID, counting on), fork 3 that diverge; each step timed.
# (`make test` runs the same story inside the test host with the Go SDK: TestDemo.)
demo: deps build
	bash contrib/scripts/demo.sh

# E2B's own JavaScript SDK (npm package `e2b`, installed at test time, unmodified) against cube-api in the test
# host, from this machine's shell, configured only by E2B_API_URL, E2B_SANDBOX_URL and E2B_API_KEY
# (contrib/sdk/e2b-compat/e2e.mjs: create, commands, files, snapshot, create from it, pause/connect, fork, kill).
e2e-e2b: deps build
	bash contrib/scripts/e2e-sdk.sh js

# The SDKs against cube-api in one test host, from this machine's shell (contrib/scripts/e2e-sdk.sh): E2B's JS SDK as
# e2e-e2b, then the Python SDK's acceptance (contrib/sdk/python/examples/acceptance.py: 3 rounds of snapshot → SIGKILL
# → rollback → create from the snapshot with the worker's counter, identity, pid and digest equal exactly; clone(4)
# and fork(3) diverging, a clone failing mid-fork leaving nothing; 409 for a second snapshot or rollback at once;
# cube-api and containerd restarted under running sandboxes; 404/400/413/401 through raw HTTP).
e2e-sdk: deps build
	bash contrib/scripts/e2e-sdk.sh

# Every fuzz target, one after another (each part's FUZZTIME / DEVICE_FUZZTIME per target).
fuzz: fuzz-hypervisor fuzz-devices agent-fuzz snapshotter-fuzz fuzz-shim fuzz-snapshot fuzz-store fuzz-cli fuzz-api fuzz-bench

clean:
	rm -rf $(BIN)

# >>> hypervisor (issue 3) — block owned by the VMM slice; merge into the main Makefile as is.
.PHONY: vmm fuzz-hypervisor
vmm:
	@mkdir -p bin
	$(GO) build -o bin/cube-vmm ./cmd/cube-vmm

# Run every hypervisor fuzz target for FUZZTIME each (go test -fuzz takes one target per run).
fuzz-hypervisor:
	$(GO) test -run '^$$' -fuzz '^FuzzLoadKernel$$' -fuzztime $(FUZZTIME) ./hypervisor/boot
	$(GO) test -run '^$$' -fuzz '^FuzzHandle$$' -fuzztime $(FUZZTIME) ./hypervisor/control
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeReply$$' -fuzztime $(FUZZTIME) ./hypervisor/control
	$(GO) test -run '^$$' -fuzz '^FuzzRunDecode$$' -fuzztime $(FUZZTIME) ./hypervisor/kvm
	$(GO) test -run '^$$' -fuzz '^FuzzRegisterAccess$$' -fuzztime $(FUZZTIME) ./hypervisor/devices/serial
	$(GO) test -run '^$$' -fuzz '^FuzzRestore$$' -fuzztime $(FUZZTIME) ./hypervisor/machine
	$(GO) test -run '^$$' -fuzz '^FuzzParseNet$$' -fuzztime $(FUZZTIME) ./hypervisor/vmmcmd
# <<< hypervisor

# >>> net benchmark (issue 16)
.PHONY: bench-net
# In the test host, one peer after the other: TCP throughput each way (NET_BENCH_REPS transfers of NET_BENCH_MIB
# MiB, every byte checked) and NET_BENCH_RTTS round trips of 64 bytes between the test host and netbench served by
# cube-vmm's virtio-net on a tap, QEMU's virtio-net-pci on a tap, and a runc container on a veth; a table with
# ratios (docs/bench/net.md).
bench-net: deps
	$(GO) test -count=1 -timeout 30m -run '^$$' -bench '^BenchmarkNet$$' -benchtime 1x -v ./integration/vmm
# <<< net benchmark

# ---- guest agent (issue 4) — begin ----------------------------------------
# The guest's /init: a static binary (no libc in the initramfs).
AGENT_VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
AGENT_LDFLAGS := -s -w -X github.com/cube-runtime/cube/guest-agent/agent.Version=$(AGENT_VERSION)

.PHONY: agent agent-proto agent-proto-check agent-test agent-fuzz

agent:
	@mkdir -p bin
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(AGENT_LDFLAGS)' -o bin/cube-agent ./cmd/cube-agent

# Regenerate guest-agent/protocol/*.pb.go (needs protoc, protoc-gen-go, protoc-gen-go-ttrpc
# on PATH: .ci/install.d/agent.sh installs the pinned versions).
agent-proto:
	PATH="$$PATH:$$($(GO) env GOPATH)/bin" $(GO) generate ./guest-agent/protocol

# Fails if the committed generated code differs from what the .proto produces (= proto-check).
agent-proto-check: proto-check

# Unit tests; those needing root (namespaces, mounts, loop devices) skip without it.
agent-test:
	$(GO) test -count=1 -p 1 ./guest-agent/... ./cmd/cube-agent

# Short fuzzing of every agent parser (FUZZTIME per target).
agent-fuzz:
	$(GO) test -run '^$$' -fuzz FuzzParseStreamHeader -fuzztime $(FUZZTIME) ./guest-agent/protocol
	$(GO) test -run '^$$' -fuzz FuzzDecodeSpec -fuzztime $(FUZZTIME) ./guest-agent/container
	$(GO) test -run '^$$' -fuzz FuzzDecodeProcess -fuzztime $(FUZZTIME) ./guest-agent/container
	$(GO) test -run '^$$' -fuzz FuzzDecodeCreateRequest -fuzztime $(FUZZTIME) ./guest-agent/agent
	$(GO) test -run '^$$' -fuzz FuzzDecodeExecRequest -fuzztime $(FUZZTIME) ./guest-agent/agent
	$(GO) test -run '^$$' -fuzz FuzzFilePathAndSerial -fuzztime $(FUZZTIME) ./guest-agent/agent
	$(GO) test -run '^$$' -fuzz FuzzPlanTree -fuzztime $(FUZZTIME) ./guest-agent/agent
	$(GO) test -run '^$$' -fuzz FuzzModInfo -fuzztime $(FUZZTIME) ./guest-agent/initsys
# ---- guest agent (issue 4) — end ------------------------------------------

# ---- snapshotter (issue 6) -------------------------------------------------
# Root tests (containerd's snapshotter suite on an XFS loop pool, the real
# containerd daemon test, disk-full) run when `make` runs as root; otherwise
# they skip with a message. containerd/ctr/shim come from PATH or
# $CUBE_CONTAINERD_BIN (.ci/install.d/containerd.sh puts them in /usr/local/bin).
.PHONY: snapshotter snapshotter-test snapshotter-test-short snapshotter-bench snapshotter-fuzz

snapshotter:
	$(GO) build -o bin/cube-snapshotter ./cmd/cube-snapshotter

snapshotter-test:
	$(GO) test -p 1 -timeout 10m ./snapshotter/... ./cmd/cube-snapshotter/...

snapshotter-test-short:
	$(GO) test -p 1 -short ./snapshotter/... ./cmd/cube-snapshotter/...

snapshotter-bench:
	$(GO) test -run XXX -bench BenchmarkPrepare -benchtime 2s ./snapshotter/

snapshotter-fuzz:
	$(GO) test -run XXX -fuzz '^FuzzParseSize$$' -fuzztime $(FUZZTIME) ./snapshotter/imagefile/
	$(GO) test -run XXX -fuzz '^FuzzParseSuperblock$$' -fuzztime $(FUZZTIME) ./snapshotter/imagefile/
	$(GO) test -run XXX -fuzz '^FuzzParseFiemap$$' -fuzztime $(FUZZTIME) ./snapshotter/imagefile/
	$(GO) test -run XXX -fuzz '^FuzzParseConfig$$' -fuzztime $(FUZZTIME) ./snapshotter/service/
# ---- end snapshotter ---------------------------------------------------------

# ---- begin: PCI/virtio devices (hypervisor/pci, hypervisor/virtio/...) ----
# Each fuzz target for DEVICE_FUZZTIME (go test -fuzz takes one target at a time).
DEVICE_FUZZTIME ?= $(FUZZTIME)
.PHONY: fuzz-devices
fuzz-devices:
	$(GO) test -run '^$$' -fuzz '^FuzzConfigSpace$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/pci/
	$(GO) test -run '^$$' -fuzz '^FuzzDescriptorChain$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/
	$(GO) test -run '^$$' -fuzz '^FuzzTransportRegisters$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/
	$(GO) test -run '^$$' -fuzz '^FuzzRequest$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/blk/
	$(GO) test -run '^$$' -fuzz '^FuzzTxPacket$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/vsock/
	$(GO) test -run '^$$' -fuzz '^FuzzParseConnect$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/vsock/
	$(GO) test -run '^$$' -fuzz '^FuzzRequest$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/fs/
	$(GO) test -run '^$$' -fuzz '^FuzzStateRestore$$' -fuzztime $(DEVICE_FUZZTIME) ./hypervisor/virtio/fs/
# ---- end: PCI/virtio devices ----

# ---- shim (containerd-shim-cube-v1) ----------------------------------------
.PHONY: shim test-shim e2e-shim bench-shim bench-cube fuzz-shim

shim:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/containerd-shim-cube-v1 ./cmd/containerd-shim-cube-v1

test-shim:
	$(GO) test -count=1 -p 1 -race ./shim/... ./cmd/containerd-shim-cube-v1/...

# Test host: the task service with the real cube-vmm and agent, and ctr run through containerd 2.4.2.
e2e-shim: deps
	$(GO) test -count=1 -timeout 60m -v ./integration/shim

# In the test host: `ctr run --rm … true` with io.cube.v1 cold boot, io.cube.v1 template restore and runc,
# 10 runs each (medians and ratios as a table); then idle-sandbox density in a 1 GiB budget and the
# per-sandbox host memory beyond guest memory (PSS of cube-vmm + shim).
bench-shim: deps
	$(GO) test -count=1 -timeout 40m -run '^$$' -bench 'BenchmarkCtrRunTrue$$' -benchtime 10x ./integration/shim
	$(GO) test -count=1 -timeout 40m -run '^$$' -bench 'BenchmarkCtrDensity$$' -benchtime 1x ./integration/shim
	$(GO) test -count=1 -timeout 40m -run '^$$' -bench 'BenchmarkVirtioFS$$' -benchtime 1x -v ./integration/shim

# In the test host, issue 14's side by side (one run, tables printed, about 10 minutes): `cube rollback` vs the
# cube-vmm op alone; `ctr containers restore --live` vs a cold `ctr run -d` (templates off) vs `ctr run -d` from
# the automatic template; `cube fork -n 1/4/8` vs as many
# `cube restore`s, and the PSS per clone vs a cold-booted sandbox (a fork that does not fit says so).
bench-cube: deps
	$(GO) test -count=1 -timeout 40m -run '^$$' -bench '^BenchmarkCube$$' -benchtime 1x -v ./integration/checkpoint

# Issue 15's benchmarks: create from a template through the SDK (c=1, c=10) vs runc's `ctr run -d`; snapshot,
# rollback, fork(1), fork(10) through the SDK and cube-api vs the cube CLI on the shim (tables only).
.PHONY: bench-api
bench-api: deps
	$(GO) test -count=1 -timeout 40m -run '^$$' -bench '^BenchmarkCubeAPI$$' -benchtime 1x -v ./integration/checkpoint

fuzz-shim:
	$(GO) test -run '^$$' -fuzz FuzzParse$$ -fuzztime $(FUZZTIME) ./shim/config
	$(GO) test -run '^$$' -fuzz FuzzParseReply -fuzztime $(FUZZTIME) ./hypervisor/vsockdial
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./shim/volume
# ---- end shim ----------------------------------------------------------------

# >>> snapshot (issue 5) — block owned by the snapshot slice; merge into the main Makefile as is.
.PHONY: e2e-snapshot bench-snapshot fuzz-snapshot
# Acceptance test in the test host: worker counter, snapshot, SIGKILL, rollback x3, restore in a new cube-vmm.
e2e-snapshot:
	$(GO) test -count=1 -timeout 60m -v -run TestRollbackAndRestore ./integration/snapshot
# In the test host (nested KVM), beside QEMU: snapshot / rollback / restore latency of a 256 MiB guest, snapshot
# latency vs dirtied MiB and restore latency vs guest size (each benchmark runs its own iterations, 5 or 10, and
# prints tables; BenchmarkSnapshotDirty alone takes about 20 minutes); then the synthetic-guest benchmarks on this
# host's /dev/kvm.
bench-snapshot:
	$(GO) test -count=1 -timeout 60m -run '^$$' -bench . -benchtime=1x -v ./integration/snapshot
	$(GO) test -run '^$$' -bench . -benchtime=10x ./hypervisor/machine
# Every parser of the snapshot format: the format package's, and each device's state.
fuzz-snapshot:
	$(GO) test -run '^$$' -fuzz '^FuzzParseManifest$$' -fuzztime $(FUZZTIME) ./hypervisor/snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeState$$' -fuzztime $(FUZZTIME) ./hypervisor/snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzDecodePayload$$' -fuzztime $(FUZZTIME) ./hypervisor/snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzDecodeBitmap$$' -fuzztime $(FUZZTIME) ./hypervisor/snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzStateCRC$$' -fuzztime $(FUZZTIME) ./hypervisor/snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzRuns$$' -fuzztime $(FUZZTIME) ./hypervisor/snapshot
	$(GO) test -run '^$$' -fuzz '^FuzzTransportState$$' -fuzztime $(FUZZTIME) ./hypervisor/virtio
	$(GO) test -run '^$$' -fuzz '^FuzzRestoreState$$' -fuzztime $(FUZZTIME) ./hypervisor/virtio/blk
	$(GO) test -run '^$$' -fuzz '^FuzzRestoreState$$' -fuzztime $(FUZZTIME) ./hypervisor/virtio/vsock
	$(GO) test -run '^$$' -fuzz '^FuzzRestoreState$$' -fuzztime $(FUZZTIME) ./hypervisor/virtio/rng
	$(GO) test -run '^$$' -fuzz '^FuzzRestoreState$$' -fuzztime $(FUZZTIME) ./hypervisor/devices/serial
# <<< snapshot

# >>> store (issue 14 item 1) — the snapshot store, checkpoint/store.
.PHONY: fuzz-store
# The parsers of the store's metadata files (snapshot, pending Begin, reference).
fuzz-store:
	$(GO) test -run '^$$' -fuzz '^FuzzParseMetadata$$' -fuzztime $(FUZZTIME) ./checkpoint/store
# <<< store

# >>> cube CLI and the shim's snapshot service (issue 14 items 2 and 5)
.PHONY: cube fuzz-cli
cube:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/cube ./cmd/cube

# containerd's bootstrap.json as the CLI reads it to find a shim.
fuzz-cli:
	$(GO) test -run '^$$' -fuzz '^FuzzParseBootstrap$$' -fuzztime $(FUZZTIME) ./checkpoint/shimclient
# <<< cube CLI

# >>> cube-api (issue 15)
.PHONY: fuzz-api
# cube-api's parsers of untrusted HTTP bodies and query strings (rollback, fork, snapshots, commands, files), and
# of E2B's envd requests (sandbox host/header, Basic user, upload bodies).
fuzz-api:
	$(GO) test -run '^$$' -fuzz '^FuzzRequests$$' -fuzztime $(FUZZTIME) ./checkpoint/api
	$(GO) test -run '^$$' -fuzz '^FuzzEnvdParsers$$' -fuzztime $(FUZZTIME) ./checkpoint/api
# <<< cube-api

.PHONY: fuzz-bench
# The benchmarks' parsers of the test host's process accounting records and /proc/PID/stat lines.
fuzz-bench:
	$(GO) test -run '^$$' -fuzz '^FuzzParse$$' -fuzztime $(FUZZTIME) ./integration/procacct
	$(GO) test -run '^$$' -fuzz '^FuzzParseStat$$' -fuzztime $(FUZZTIME) ./integration/procacct

# >>> cube-api and SDKs (issue 15) — the HTTP facade, checkpoint/api; SDKs in contrib/sdk/.
.PHONY: cube-api e2e-api test-sdk
cube-api:
	@mkdir -p $(BIN)
	CGO_ENABLED=0 $(GO) build -o $(BIN)/cube-api ./cmd/cube-api

# In the test host: cube-api against containerd, the shim and cube-vmm, driven through the Go SDK.
e2e-api: deps
	$(GO) test -count=1 -timeout 60m -v -run TestCubeAPI ./integration/checkpoint

# The facade's unit tests and both SDKs' (the Python suite runs through contrib/sdk/python's Go test).
test-sdk:
	$(GO) test -count=1 ./checkpoint/api ./contrib/sdk/...
# <<< cube-api

# >>> critest (issue 17 item 2)
.PHONY: critest
# In the test host: cri-tools' CRI validation suite, critest v1.37.0, in full: with containerd's runc handler, then
# with --runtime-handler cube, counts side by side; fails on a spec cube fails that runc passes and
# integration/critest/skip.txt does not list (`make test` runs a subset of it: TestCritest's defaultFocus).
critest: deps
	CUBE_CRITEST_FULL=1 $(GO) test -count=1 -timeout 180m -v -run '^TestCritest$$' ./integration/critest
# <<< critest
