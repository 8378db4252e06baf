package agent

import (
	"testing"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

func seed(f *testing.F, m proto.Message) {
	b, err := proto.Marshal(m)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
}

// Wire bytes → request → validation: never a panic, and every rejection is
// a status error with a client-side code.
func FuzzDecodeCreateRequest(f *testing.F) {
	seed(f, &protocol.CreateContainerRequest{ContainerId: "c", Rootfs: "/r", Spec: specJSON(f, testSpec("/r", "sh"))})
	seed(f, &protocol.CreateContainerRequest{ContainerId: "c", Spec: []byte(`{"process":{"args":["a"],"cwd":"/"},"linux":{"namespaces":[{"type":"mount"},{"type":"user"}]}}`)})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req protocol.CreateContainerRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		spec, rootfs, err := decodeCreate(&req)
		if err != nil {
			if c := status.Code(err); c != codes.InvalidArgument && c != codes.NotFound {
				t.Fatalf("rejection with code %v: %v", c, err)
			}
			return
		}
		if spec.Process == nil || rootfs == "" {
			t.Fatalf("accepted request without process or rootfs")
		}
	})
}

func FuzzDecodeExecRequest(f *testing.F) {
	seed(f, &protocol.ExecProcessRequest{ContainerId: "c", ExecId: "e", Process: []byte(`{"args":["sh"],"cwd":"/","terminal":true,"consoleSize":{"width":80,"height":24}}`)})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req protocol.ExecProcessRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		if _, err := decodeExec(&req); err != nil && status.Code(err) != codes.InvalidArgument {
			t.Fatalf("rejection with code %v: %v", status.Code(err), err)
		}
	})
}

func FuzzFilePathAndSerial(f *testing.F) {
	f.Add("/etc/hosts")
	f.Add("virtio-serial-1")
	f.Fuzz(func(t *testing.T, s string) {
		validFilePath(s)
		validSerial(s)
		protocol.ValidateID("x", s)
	})
}

// Wire bytes → SyncTree plan: never a panic; an accepted plan names only
// clean relative paths and links that stay inside the tree.
func FuzzPlanTree(f *testing.F) {
	seed(f, &protocol.SyncTreeRequest{Dir: "/run/cube/volumes/c", Entries: kubeletTree("1", map[string]string{"k": "v"})})
	seed(f, &protocol.SyncTreeRequest{Entries: []*protocol.TreeEntry{
		{Path: "d", Kind: protocol.TreeEntry_DIR}, {Path: "d/l", Kind: protocol.TreeEntry_SYMLINK, Target: "../x"}}})
	f.Fuzz(func(t *testing.T, data []byte) {
		var req protocol.SyncTreeRequest
		if proto.Unmarshal(data, &req) != nil {
			return
		}
		pl, err := planTree(&req)
		if err != nil {
			return
		}
		for _, e := range append(append(pl.dirs, pl.files...), pl.links...) {
			if validTreePath(e.GetPath()) != nil {
				t.Fatalf("accepted path %q", e.GetPath())
			}
			if e.GetKind() == protocol.TreeEntry_SYMLINK && validLinkTarget(e.GetPath(), e.GetTarget()) != nil {
				t.Fatalf("accepted link %q → %q", e.GetPath(), e.GetTarget())
			}
		}
	})
}
