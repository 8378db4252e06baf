// Package agent implements the guest agent's ttrpc service (the Agent
// service of package protocol) and the stdio stream server: it keeps the
// registry of containers and processes and their lifecycle states, and the
// guest-wide operations (disks, filesystem freeze, clock, RNG, files,
// power-off).
package agent
