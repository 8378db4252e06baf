// Package netif sets the state of the guest's network interfaces. Today that
// is only the loopback: the kernel creates `lo` down in every network
// namespace, including the initial one, and nothing but the agent (the
// guest's /init) is there to bring it up. It uses the classic interface
// ioctls on a datagram socket (no netlink library); the namespace acted on is
// the calling thread's.
package netif
