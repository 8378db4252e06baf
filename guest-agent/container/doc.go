// Package container turns an OCI runtime spec into a running process inside
// the guest: namespaces, mounts, pivot_root into the rootfs, hostname,
// rlimits, credentials, cwd and finally execve. It also starts extra
// processes inside a running container (exec).
//
// Go cannot run code between fork and exec, so the agent re-executes its own
// binary as a short-lived helper ("cube-container-init") in the new
// namespaces. The helper reads an InitConfig from fd 3, reports on a status
// pipe (fd 4) and waits on a start pipe (fd 5) right before execve, which is
// what splits Create from Start. Binaries embedding this package must call
// MaybeRunInit first thing in main (and in TestMain).
package container
