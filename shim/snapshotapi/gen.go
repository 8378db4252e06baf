package snapshotapi

// Regenerate snapshot.pb.go and snapshot_ttrpc.pb.go (generator versions in doc.go):
//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative snapshot.proto
