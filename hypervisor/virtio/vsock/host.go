package vsock

import (
	"errors"
	"fmt"
	"io"
	"net"
	"sync"
	"time"
)

// ---- host side ----

func (d *Device) acceptLoop() {
	defer d.wg.Done()
	for {
		nc, err := d.ln.Accept()
		if err != nil {
			d.mu.Lock()
			closed := d.closed
			d.mu.Unlock()
			if closed {
				return
			}
			log.WithError(err).Warn("vsock: accept failed")
			time.Sleep(10 * time.Millisecond)
			continue
		}
		d.mu.Lock()
		if d.closed {
			d.mu.Unlock()
			nc.Close()
			return
		}
		d.hs[nc] = struct{}{}
		d.wg.Add(1)
		d.mu.Unlock()
		go d.handshake(nc)
	}
}

// readLine reads up to '\n' byte by byte, so no stream byte after the line is
// consumed by a buffer.
func readLine(r io.Reader, max int) (string, error) {
	var line []byte
	var b [1]byte
	for len(line) <= max {
		if _, err := io.ReadFull(r, b[:]); err != nil {
			return "", err
		}
		if b[0] == '\n' {
			return string(line), nil
		}
		line = append(line, b[0])
	}
	return "", fmt.Errorf("handshake line longer than %d bytes", max)
}

func (d *Device) handshake(nc net.Conn) {
	defer d.wg.Done()
	_ = nc.SetReadDeadline(time.Now().Add(HandshakeTimeout))
	line, err := readLine(nc, maxHandshake)
	var port uint32
	if err == nil {
		port, err = ParseConnect(line)
	}
	_ = nc.SetReadDeadline(time.Time{})
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.hs, nc)
	if err == nil && d.env == nil {
		err = errors.New("guest driver not ready")
	}
	if err == nil && len(d.conns) >= MaxConns {
		err = fmt.Errorf("%d connections open", len(d.conns))
	}
	if err != nil || d.closed {
		log.WithError(err).Debug("vsock: host connect rejected")
		nc.Close()
		return
	}
	key := connKey{peer: port}
	for i := 0; ; i++ {
		key.local = d.nextPort
		d.nextPort++
		if d.nextPort == 0 {
			d.nextPort = firstHostPort
		}
		if d.conns[key] == nil {
			break
		}
		if i > 1<<20 {
			nc.Close()
			return
		}
	}
	c := &conn{key: key, nc: nc, state: stAwaiting, cond: sync.NewCond(&d.mu)}
	d.conns[key] = c
	d.ctrlLocked(c, OpRequest, 0)
	d.processRxLocked()
	time.AfterFunc(ConnectTimeout, func() {
		d.mu.Lock()
		defer d.mu.Unlock()
		if !c.closed && c.state == stAwaiting {
			d.closeLocked(c, true)
			d.processRxLocked()
		}
	})
}

// startIOLocked starts the two pumps of an established connection.
func (d *Device) startIOLocked(c *conn) {
	d.wg.Add(2)
	go d.hostReader(c)
	go d.hostWriter(c)
}

// credit is how many more bytes the guest can take on this connection.
func (c *conn) credit() int64 {
	inFlight := int64(uint32(c.txCnt - c.peerFwdCnt))
	return int64(c.peerBufAlloc) - inFlight - int64(c.txbuf.Len())
}

// hostReader pumps host socket → guest, within the guest's credit.
func (d *Device) hostReader(c *conn) {
	defer d.wg.Done()
	buf := make([]byte, MaxPayload)
	for {
		d.mu.Lock()
		for !c.closed && c.peerShut&ShutdownRcv == 0 && c.credit() <= 0 {
			c.cond.Wait()
		}
		if c.closed || c.peerShut&ShutdownRcv != 0 {
			d.mu.Unlock()
			return
		}
		n := min(c.credit(), int64(len(buf)))
		d.mu.Unlock()

		k, err := c.nc.Read(buf[:n])

		d.mu.Lock()
		if c.closed {
			d.mu.Unlock()
			return
		}
		if k > 0 {
			c.txbuf.Write(buf[:k])
			d.queueConnLocked(c)
		}
		if err != nil {
			// EOF or error: the host will send no more. Tell the guest after
			// the buffered bytes (SHUTDOWN SEND); the host may still read.
			c.hostEOF = true
			d.queueConnLocked(c)
			d.processRxLocked()
			d.mu.Unlock()
			return
		}
		d.processRxLocked()
		d.mu.Unlock()
	}
}

// hostWriter pumps guest → host socket and returns credit to the guest.
func (d *Device) hostWriter(c *conn) {
	defer d.wg.Done()
	if c.greeting != "" {
		if _, err := io.WriteString(c.nc, c.greeting); err != nil {
			d.mu.Lock()
			d.closeLocked(c, true)
			d.processRxLocked()
			d.mu.Unlock()
			return
		}
	}
	buf := make([]byte, MaxPayload)
	halfClosed := false
	for {
		d.mu.Lock()
		for !c.closed && c.rxbuf.Len() == 0 {
			if c.peerShut == ShutdownRcv|ShutdownSend {
				// Everything the guest sent is forwarded and it is done both
				// ways: finish with RST, which Linux waits for on close.
				d.closeLocked(c, true)
				d.processRxLocked()
				break
			}
			if c.peerShut&ShutdownSend != 0 && !halfClosed {
				halfClosed = true
				if cw, ok := c.nc.(interface{ CloseWrite() error }); ok {
					_ = cw.CloseWrite()
				}
				continue
			}
			c.cond.Wait()
		}
		if c.closed {
			d.mu.Unlock()
			return
		}
		n, _ := c.rxbuf.Read(buf)
		d.mu.Unlock()

		_, err := c.nc.Write(buf[:n])

		d.mu.Lock()
		if c.closed {
			d.mu.Unlock()
			return
		}
		if err != nil {
			d.closeLocked(c, true)
			d.processRxLocked()
			d.mu.Unlock()
			return
		}
		c.fwdCnt += uint32(n)
		// Return credit in batches, and always once drained, so a guest
		// blocked on a full window always hears about the space.
		if uint32(c.fwdCnt-c.advFwd) >= BufAlloc/4 || c.rxbuf.Len() == 0 {
			c.needCredit = true
			d.queueConnLocked(c)
			d.processRxLocked()
		}
		d.mu.Unlock()
	}
}
