package agent

import "golang.org/x/sys/unix"

var errECONNRESET = unix.ECONNRESET
