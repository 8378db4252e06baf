package manager_test

import (
	"net"
	"strings"
)

func shimDial(address string) (net.Conn, error) {
	return net.Dial("unix", strings.TrimPrefix(address, "unix://"))
}
