// Package envdpb holds the messages of E2B's envd services, process.Process
// (envdpb/process) and filesystem.Filesystem (envdpb/filesystem), generated
// from our own .proto files written from E2B's published interface. cube-api
// serves them over Connect RPC (checkpoint/api/envd*.go). `make envd-proto`
// regenerates them (protoc and protoc-gen-go of the pinned versions, and
// Debian's libprotobuf-dev for google/protobuf/timestamp.proto).
package envdpb

//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative process/process.proto
//go:generate protoc --proto_path=. --proto_path=/usr/include --go_out=. --go_opt=paths=source_relative filesystem/filesystem.proto
