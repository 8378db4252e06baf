// Package netif sets the state of the guest's network interfaces.
//
// The loopback: the kernel creates `lo` down in every network namespace,
// including the initial one, and nothing but the agent (the guest's /init)
// is there to bring it up; Up and LoopbackUp use the classic interface
// ioctls on a datagram socket.
//
// The NIC: Parse validates a configuration sent by the host (untrusted:
// every count and length is bounded) and Apply makes each interface, found
// by MAC, look exactly like it over rtnetlink (github.com/vishvananda/netlink):
// MAC, MTU, up, addresses, routes. The whole state is given, so applying it
// again changes nothing and applying another one (a restored sandbox's new
// MAC and address) replaces the old. The namespace acted on is the calling
// thread's.
package netif
