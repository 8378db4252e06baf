// Package checkpoint is the layer above the VMM: the snapshot store, the mapping onto containerd's
// checkpoint and restore, fork and the HTTP facade live here (../shared/ARCHITECTURE.md). The VM snapshot's
// on-disk format is not here: it is hypervisor/snapshot, which this layer uses and which imports nothing of
// it. So far: the snapshot store (checkpoint/store, docs/store.md); finding a container's shim and its
// snapshot service (checkpoint/shimclient); taking a snapshot into the store through it
// (checkpoint/snapshots); the cube CLI (checkpoint/cli, docs/cli.md); the HTTP facade cube-api
// (checkpoint/api, docs/api.md).
package checkpoint
