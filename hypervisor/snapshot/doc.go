// Package snapshot is Cube's on-disk VM snapshot format, all of it, and the
// atomic writing and validated opening of a snapshot directory. A directory
// holds a manifest (format version, VM shape, component digests and
// versions, memory layers, cube-vmm's configuration), a state file (magic,
// version, CRC-protected payload), guest memory file(s) with their bitmaps,
// and copies of the writable disk images.
//
// The payload (State) is the vCPU and VM state, in structs here that mirror
// KVM's, and one record per device, whose state the device itself saves and
// restores (Device; each device's state is in a state.go beside it). One
// number, Version (version.go), versions all of it; testdata holds a golden
// snapshot of each version, and the tests keep it decoding byte for byte.
//
// A snapshot directory is written under a temporary name, fsynced and
// renamed into place, so a directory with the final name is always
// complete; Open refuses anything it cannot fully validate.
//
// The package imports nothing of this module: the machine and the devices
// import it, and so may the layers above the VMM, read-only.
package snapshot
