// Package cubetest is what the e2e packages above the guest (integration/shim, integration/checkpoint)
// share: Main boots one test host per package with the shim, the snapshotter, the cube CLI, containerd, ctr,
// crictl, runc, the CNI plugins and a busybox image; inside it, StartDaemons runs containerd 2.4.2 with
// cube-snapshotter and io.cube.v1, and Daemons' methods drive it through ctr and the cube CLI (tasks,
// counters, background commands, log excerpts for failures).
//
// It is a test helper: it calls testing.TB's Fatal and is imported only by _test.go files.
package cubetest
