// Package protocol is the wire contract between the Cube shim (host) and the
// guest agent (the guest's /init). It is the only guest-agent package the
// host side imports.
//
// # Transport
//
// The agent listens on two vsock ports of the guest:
//
//   - AgentPort: ttrpc (github.com/containerd/ttrpc) carrying the Agent
//     service defined in agent.proto (client: NewAgentClient).
//   - StreamPort: raw byte streams for process stdio. A connection begins
//     with a one-line header (StreamHeader, see stream.go); the agent answers
//     "OK\n" or "ERR <reason>\n" and then the connection is that stream.
//     stdin: host → guest, the host's half-close (or CloseStdin) is EOF;
//     stdout/stderr: guest → host, the agent closes the connection at EOF.
//
// On the host there is no vhost-vsock: the VMM exposes the guest's vsock as a
// Unix socket with Firecracker's hybrid handshake ("CONNECT <port>\n").
//
// # Lifecycle
//
// CreateContainer (or ExecProcess) prepares a process and parks it just
// before execve; the host attaches the stdio streams it asked for, then calls
// Start. Output written before a stream is attached stays in the pipe (64 KiB);
// a process writing more blocks until the host attaches. Wait returns once the
// process has exited; the host should additionally read stdout/stderr to EOF
// to get all output. Delete releases an exited process (or a container).
//
// # Snapshots and restores
//
// FreezeFilesystems/ThawFilesystems bracket a snapshot. After a VM restore
// every vsock connection is reset (the listeners survive): the agent counts
// the reset (HealthResponse.transport_resets), keeps all processes running,
// reseeds its RNG from virtio-rng if present, and accepts new connections.
// The host should then call SetTime, ReseedRandom and ThawFilesystems.
//
// # Errors
//
// Errors are ttrpc status errors (google.golang.org/grpc/status) with codes
// NotFound, InvalidArgument, AlreadyExists, FailedPrecondition, Unavailable
// or Internal, and a message naming the object concerned.
//
// # Regenerating
//
// `go generate ./guest-agent/protocol` (or `make agent-proto`) runs
// protoc 3.21.12 (Debian 12 `protobuf-compiler`) with
// protoc-gen-go v1.36.12 (google.golang.org/protobuf/cmd/protoc-gen-go) and
// protoc-gen-go-ttrpc v1.2.10 (github.com/containerd/ttrpc/cmd/protoc-gen-go-ttrpc).
package protocol

const (
	// ProtocolVersion changes when a method's meaning changes incompatibly.
	ProtocolVersion = 1
	// AgentPort is the vsock port of the ttrpc Agent service.
	AgentPort = 1024
	// StreamPort is the vsock port for stdio streams.
	StreamPort = 1025
	// MaxFileChunk bounds ReadFile/WriteFile payloads (ttrpc messages are
	// limited to 4 MiB).
	MaxFileChunk = 2 << 20
	// MaxDirEntries bounds the entries of one ListDir answer (each at most
	// 255 bytes of name and a 4 KiB symlink target: within 4 MiB).
	MaxDirEntries = 500
	// MaxTreeBytes bounds the file data of one SyncTree request, and so a
	// volume copied into the guest (Kubernetes keeps a configMap or secret
	// under 1 MiB; the rest of the 4 MiB ttrpc message is metadata).
	MaxTreeBytes = 3 << 20
	// MaxTreeEntries bounds the entries of one SyncTree request.
	MaxTreeEntries = 4096
	// VolumeRoot is where SyncTree's directories live in the guest;
	// PrepareVolume's live under RunRoot.
	VolumeRoot = "/run/cube/volumes"
	RunRoot    = "/run/cube"
	// MaxSpecSize bounds the JSON OCI spec or process in a request.
	MaxSpecSize = 1 << 20
	// MaxIDLength bounds container and exec ids.
	MaxIDLength = 128
)
