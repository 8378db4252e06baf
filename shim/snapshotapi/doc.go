// Package snapshotapi is the wire contract of the shim's own snapshot
// service, cube.snapshot.v1 (snapshot.proto): the generated ttrpc client and
// server, and the service's name. The shim serves it (shim/snapshotsvc);
// clients (checkpoint/shimclient, the cube CLI) import this package only. It
// imports nothing of ours.
//
// # Regenerating
//
// `go generate ./shim/snapshotapi` (or `make snapshot-proto`) runs
// protoc 3.21.12 (Debian 12 `protobuf-compiler`) with
// protoc-gen-go v1.36.12 (google.golang.org/protobuf/cmd/protoc-gen-go) and
// protoc-gen-go-ttrpc v1.2.10 (github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc),
// the versions the guest agent's protocol is generated with; `make
// proto-check` fails when the committed code differs from what snapshot.proto
// produces.
package snapshotapi

// ServiceName is the ttrpc service name clients and the server use.
const ServiceName = "cube.snapshot.v1.Snapshots"

// MaxRefLength bounds a request's ids, names and refs (the store's names are
// at most 128 bytes, sandbox ids 256); MaxNames the names of one snapshot.
const (
	MaxRefLength = 256
	MaxNames     = 32
)
