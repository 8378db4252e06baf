package filesapi

// Regenerate files.pb.go and files_ttrpc.pb.go (generator versions in guest-agent/protocol/doc.go):
//go:generate protoc --proto_path=. --go_out=. --go_opt=paths=source_relative --go-ttrpc_out=. --go-ttrpc_opt=paths=source_relative files.proto
