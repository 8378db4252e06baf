// Package initsys is what the guest agent does as PID 1 of the microVM:
// leave the initramfs for a tmpfs root, mount the pseudo filesystems, put the
// console on stdio, load the kernel modules the sandbox needs, bring up the
// loopback, reap orphaned processes and power the VM off.
package initsys
