package checkpoint

import (
	"context"
	"fmt"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	cube "github.com/cube-runtime/cube/contrib/sdk/go"
	"github.com/cube-runtime/cube/integration/cubetest"
)

// BenchmarkCubeAPI is issue 15's benchmarks, side by side in one test host
// run (-benchtime 1x; tables only, nothing asserted on times):
//   - create a sandbox from a template through the SDK (one at a time, and 10
//     at once) vs `ctr run -d` with runc on the same containerd;
//   - snapshot, rollback and fork(1), fork(10) through the SDK and cube-api
//     vs the same operation called directly on the shim (the `cube` CLI, on
//     the same sandbox): the facade's overhead;
//   - CubeSandbox's published figures beside ours as ratios, on paper (theirs:
//     bare metal; ours: a nested VM under TCG).
func BenchmarkCubeAPI(b *testing.B) {
	d := startDaemons(b)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	// Idle sandboxes (idleCommand): ten busy ones would measure the test
	// host's CPU, not the creates and forks.
	c, _ := d.newAPI(b, ctx, idleCommand)
	for b.Loop() {
		var out strings.Builder
		tp, err := c.BuildTemplate(ctx, cubetest.ImageRef, cube.BuildTemplateOptions{TemplateID: "bench-tpl"})
		if err != nil {
			b.Fatalf("build a template: %v", err)
		}
		b.Cleanup(func() { c.DeleteTemplate(context.Background(), tp.TemplateID) })
		fmt.Fprintf(&out, "\ntemplate %s built in %.0f ms\n", tp.TemplateID, tp.BuildMs)
		r := &apiBench{b: b, d: d, c: c, ctx: ctx, out: &out, tmpl: tp.TemplateID}
		r.create()
		r.operations()
		b.Log("\n" + out.String())
	}
}

// apiBench carries one BenchmarkCubeAPI run: its clients and the table rows.
type apiBench struct {
	b    *testing.B
	d    *daemons
	c    *cube.Client
	ctx  context.Context
	out  *strings.Builder
	tmpl string
	rows []apiRow
}

// apiRow is one operation through the SDK beside the direct path.
type apiRow struct {
	op          string
	sdk, direct []time.Duration
	theirs      float64 // CubeSandbox, bare metal, ms (0: none published)
}

const apiBenchSamples = 3

// create times sandbox creation from the template through the SDK, one at a
// time and 10 at once, beside runc's `ctr run -d` (the e2e namespace).
func (r *apiBench) create() {
	b := r.b
	var one, runc []time.Duration
	for i := range apiBenchSamples {
		start := time.Now()
		sb, err := r.c.Create(r.ctx, cube.CreateOptions{Template: r.tmpl, Timeout: 600})
		if err != nil {
			b.Fatalf("create %d from the template: %v", i, err)
		}
		one = append(one, time.Since(start))
		if err := sb.Kill(r.ctx); err != nil {
			b.Errorf("kill %s: %v", sb.ID, err)
		}
		id := fmt.Sprintf("bench-runc-%d", i)
		args := append(append([]string{"run", "-d"}, cubetest.RuncRuntime.Args...), cubetest.ImageRef, id, "sleep", "600")
		start = time.Now()
		if o, rc, err := r.d.CtrQuiet(nil, args...); err != nil || rc != 0 {
			b.Fatalf("ctr run -d (runc): rc %d %v\n%s", rc, err, o)
		}
		runc = append(runc, time.Since(start))
		r.d.Remove(b, id)
	}
	// Ten at once: each create's latency and the wall of all ten.
	const n = 10
	lat := make([]time.Duration, n)
	made := make([]*cube.Sandbox, n)
	errs := make([]error, n)
	var wg sync.WaitGroup
	from := r.d.LogSize()
	start := time.Now()
	for i := range n {
		wg.Go(func() {
			t0 := time.Now()
			made[i], errs[i] = r.c.Create(r.ctx, cube.CreateOptions{Template: r.tmpl, Timeout: 600})
			lat[i] = time.Since(t0)
		})
	}
	r.d.waitOrStacks(b, &wg, from, "creates")
	wall := time.Since(start)
	failed := 0
	for i, sb := range made {
		if errs[i] != nil {
			failed++
			b.Errorf("create %d of 10 at once: %v", i, errs[i])
			continue
		}
		if err := sb.Kill(r.ctx); err != nil {
			b.Errorf("kill %s: %v", sb.ID, err)
		}
	}
	mo, mr := cubetest.Median(one), cubetest.Median(runc)
	fmt.Fprintf(r.out, "\n### create from a template (SDK → cube-api → containerd → restore) vs `ctr run -d` with runc\n\n")
	fmt.Fprintf(r.out, "| op | samples | median | min | max |\n|---|---|---|---|---|\n")
	fmt.Fprintf(r.out, "| SDK create from the template, one at a time | %d | %v | %v | %v |\n", len(one), ms(mo), ms(minDur(one)), ms(maxDur(one)))
	fmt.Fprintf(r.out, "| `ctr run -d` with runc | %d | %v | %v | %v |\n", len(runc), ms(mr), ms(minDur(runc)), ms(maxDur(runc)))
	fmt.Fprintf(r.out, "| SDK create, 10 at once: each | %d (%d failed) | %v | %v | %v |\n", n-failed, failed, ms(cubetest.Median(lat)), ms(minDur(lat)), ms(maxDur(lat)))
	fmt.Fprintf(r.out, "| SDK create, 10 at once: wall of all | 1 | %v | | |\n", ms(wall))
	if mr > 0 {
		fmt.Fprintf(r.out, "\ncreate (c=1) / runc: %.2fx (goal ≤ 1.5x); 10 at once, wall / 10 / runc: %.2fx; CubeSandbox create from template (bare metal) %.1f ms: ours is %.0fx theirs\n",
			float64(mo)/float64(mr), float64(wall)/10/float64(mr), 47.8, float64(mo)/float64(time.Millisecond)/47.8)
	}
}

// operations times snapshot, rollback, fork(1) and fork(10) of one source
// sandbox through the SDK and through the cube CLI (the shim's services,
// no facade), alternating so both see the same machine.
func (r *apiBench) operations() {
	b := r.b
	src, err := r.c.Create(r.ctx, cube.CreateOptions{Template: r.tmpl, Timeout: 1200})
	if err != nil {
		b.Fatalf("create the source: %v", err)
	}
	defer src.Kill(context.Background())
	cli := func(args ...string) time.Duration {
		all := append([]string{"--namespace", apiNamespace}, args...)
		start := time.Now()
		o, rc := r.d.Cube(b, all...)
		took := time.Since(start)
		if rc != 0 {
			b.Fatalf("cube %s: rc %d\n%s", strings.Join(args, " "), rc, o)
		}
		return took
	}
	snap := apiRow{op: "snapshot", theirs: 49.8}
	roll := apiRow{op: "rollback", theirs: 81.6 - 49.8}
	var keep string
	for i := range apiBenchSamples {
		start := time.Now()
		sn, err := src.CreateSnapshot(r.ctx, fmt.Sprintf("bench-sdk-%d", i))
		if err != nil {
			b.Fatalf("SDK snapshot %d: %v", i, err)
		}
		snap.sdk = append(snap.sdk, time.Since(start))
		snap.direct = append(snap.direct, cli("snapshot", src.ID, "--name", fmt.Sprintf("bench-cli-%d", i)))
		if keep == "" {
			keep = sn.SnapshotID
		}
	}
	for range apiBenchSamples {
		start := time.Now()
		if _, err := src.Rollback(r.ctx, keep); err != nil {
			b.Fatalf("SDK rollback: %v", err)
		}
		roll.sdk = append(roll.sdk, time.Since(start))
		roll.direct = append(roll.direct, cli("rollback", src.ID, keep))
	}
	r.rows = append(r.rows, snap, roll)
	for _, n := range []int{1, 10} {
		r.rows = append(r.rows, r.fork(src, n, cli))
	}
	r.table()
	// Ordering: the source maps the snapshot it rolled back to; it goes first.
	if err := src.Kill(r.ctx); err != nil {
		b.Errorf("kill the source: %v", err)
	}
	for i := range apiBenchSamples {
		for _, name := range []string{fmt.Sprintf("bench-sdk-%d", i), fmt.Sprintf("bench-cli-%d", i)} {
			if err := r.c.DeleteSnapshot(r.ctx, name); err != nil {
				b.Errorf("delete snapshot %s: %v", name, err)
			}
		}
	}
}

// fork forks src n ways through the SDK and then through `cube fork -n`,
// removing the clones of each before the next.
func (r *apiBench) fork(src *cube.Sandbox, n int, cli func(...string) time.Duration) apiRow {
	b := r.b
	row := apiRow{op: "fork(" + strconv.Itoa(n) + ")"}
	if n == 1 {
		row.theirs = 219.6
	}
	start := time.Now()
	items, err := src.Fork(r.ctx, n, cube.ForkOptions{Timeout: 600, AllOrNothing: true})
	if err != nil {
		b.Fatalf("SDK fork %d: %v", n, err)
	}
	row.sdk = append(row.sdk, time.Since(start))
	for i, it := range items {
		if it.Err != nil {
			b.Errorf("SDK fork %d, item %d: %v", n, i, it.Err)
			continue
		}
		if err := it.Sandbox.Kill(r.ctx); err != nil {
			b.Errorf("kill clone %s: %v", it.Sandbox.ID, err)
		}
	}
	prefix := fmt.Sprintf("bench-f%d", n)
	row.direct = append(row.direct, cli("fork", src.ID, "-n", strconv.Itoa(n), "--all-or-nothing", "--prefix", prefix))
	for _, id := range r.d.containersWithPrefix(b, prefix+"-") {
		r.d.removeIn(b, apiNamespace, id)
	}
	return row
}

// table prints the facade rows: SDK vs direct, and CubeSandbox's figure.
func (r *apiBench) table() {
	fmt.Fprintf(r.out, "\n### through the SDK and cube-api vs called directly (`cube` CLI → the shim), same sandbox, alternating\n\n")
	fmt.Fprintf(r.out, "| op | samples | SDK median | direct median | SDK / direct | CubeSandbox bare metal | ours / theirs |\n|---|---|---|---|---|---|---|\n")
	for _, row := range r.rows {
		ms1, ms2 := cubetest.Median(row.sdk), cubetest.Median(row.direct)
		ratio, theirs, vs := "", "", ""
		if ms2 > 0 {
			ratio = fmt.Sprintf("%.2fx", float64(ms1)/float64(ms2))
		}
		if row.theirs > 0 {
			theirs = fmt.Sprintf("%.1f ms", row.theirs)
			vs = fmt.Sprintf("%.0fx", float64(ms1)/float64(time.Millisecond)/row.theirs)
		}
		fmt.Fprintf(r.out, "| %s | %d | %v | %v | %s | %s | %s |\n", row.op, len(row.sdk), ms(ms1), ms(ms2), ratio, theirs, vs)
	}
	fmt.Fprintf(r.out, "\n(CubeSandbox's rollback is their snapshot+rollback figure minus their snapshot figure.)\n")
}

// containersWithPrefix lists cube-api's namespace's containers whose id starts with prefix.
func (d *daemons) containersWithPrefix(tb testing.TB, prefix string) []string {
	o, err := d.ctrIn(apiNamespace, "containers", "ls", "-q")
	if err != nil {
		tb.Fatalf("ctr containers ls: %v\n%s", err, o)
	}
	var ids []string
	for _, id := range strings.Fields(o) {
		if strings.HasPrefix(id, prefix) {
			ids = append(ids, id)
		}
	}
	return ids
}

// removeIn kills and removes a container of namespace ns.
func (d *daemons) removeIn(tb testing.TB, ns, id string) {
	d.ctrIn(ns, "task", "rm", "-f", id)
	if o, err := d.ctrIn(ns, "containers", "rm", id); err != nil {
		tb.Errorf("ctr containers rm %s: %v\n%s", id, err, o)
	}
}

// ctrIn runs ctr in namespace ns (cubetest's ctr helpers use the e2e namespace).
func (d *daemons) ctrIn(ns string, args ...string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, cubetest.CtrBin, append([]string{"--address", d.Dir + "/containerd.sock", "--namespace", ns}, args...)...)
	cmd.Env = d.Env
	out, err := cmd.CombinedOutput()
	return string(out), err
}
