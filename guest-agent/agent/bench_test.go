package agent

import (
	"context"
	"fmt"
	"testing"

	"github.com/cube-runtime/cube/guest-agent/protocol"
	specs "github.com/opencontainers/runtime-spec/specs-go"
)

// BenchmarkContainerLifecycle: create + start + wait + delete of a busybox
// `true` container through ttrpc over a Unix socket (root only).
func BenchmarkContainerLifecycle(b *testing.B) {
	needRoot(b)
	h := newHarness(b, nil)
	root := makeRootfs(b)
	spec := specJSON(b, testSpec(root, "true"))
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("b%d", i)
		if _, err := h.client.CreateContainer(ctx, &protocol.CreateContainerRequest{ContainerId: id, Spec: spec}); err != nil {
			b.Fatal(err)
		}
		if _, err := h.client.Start(ctx, &protocol.StartRequest{ContainerId: id}); err != nil {
			b.Fatal(err)
		}
		if w, err := h.client.Wait(ctx, &protocol.WaitRequest{ContainerId: id}); err != nil || w.ExitStatus != 0 {
			b.Fatal(w, err)
		}
		if _, err := h.client.Delete(ctx, &protocol.DeleteRequest{ContainerId: id}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkExec: exec + start + wait + delete of `true` in a running container.
func BenchmarkExec(b *testing.B) {
	needRoot(b)
	h := newHarness(b, nil)
	root := makeRootfs(b)
	h.create("bench", testSpec(root, "sleep", "1000"), nil)
	h.start("bench", "")
	proc := specJSON(b, &specs.Process{Args: []string{"true"}, Cwd: "/", Env: []string{"PATH=/bin"}})
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		id := fmt.Sprintf("e%d", i)
		if _, err := h.client.ExecProcess(ctx, &protocol.ExecProcessRequest{ContainerId: "bench", ExecId: id, Process: proc}); err != nil {
			b.Fatal(err)
		}
		if _, err := h.client.Start(ctx, &protocol.StartRequest{ContainerId: "bench", ExecId: id}); err != nil {
			b.Fatal(err)
		}
		if w, err := h.client.Wait(ctx, &protocol.WaitRequest{ContainerId: "bench", ExecId: id}); err != nil || w.ExitStatus != 0 {
			b.Fatal(w, err)
		}
		if _, err := h.client.Delete(ctx, &protocol.DeleteRequest{ContainerId: "bench", ExecId: id}); err != nil {
			b.Fatal(err)
		}
	}
}
