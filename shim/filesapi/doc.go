// Package filesapi is the shim's files service, cube.files.v1 (files.proto):
// the generated messages, the ttrpc client and server, and the bounds.
package filesapi

const (
	// MaxChunk bounds one ReadFile or WriteFile (the guest agent's
	// protocol.MaxFileChunk; ttrpc messages are limited to 4 MiB).
	MaxChunk = 2 << 20
	// MaxDirEntries bounds one ListDir answer (the agent's).
	MaxDirEntries = 500
	// MaxPath bounds a path (PATH_MAX).
	MaxPath = 4096
)
