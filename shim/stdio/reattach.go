package stdio

import (
	"io"
)

// Re-attachment after a rollback. A rollback of the VM resets every vsock
// connection, the guest streams of running processes included, while the
// processes run on and containerd's fifos stay where they are. So the host
// ends outlive their guest streams:
//
//	Hold      before the VMM's op: a guest stream that ends from now on
//	          leaves its host end open; stdin written meanwhile waits
//	Reattach  the VMM's op succeeded: new guest streams (the agent replaced
//	          the dead ones) are pumped into the same host ends; stdin
//	          goes on into the new stream
//	Release   the VMM's op failed (no reset): host ends whose guest stream
//	          ended meanwhile are closed as they would have been

// pump copies one guest output stream into its host end (discarded when
// there is none) and closes both at the end, unless a rollback holds the
// host end or has re-attached it since.
func (i *IO) pump(name string, dst io.WriteCloser, src io.ReadCloser) {
	i.mu.Lock()
	gen := i.outGen
	i.guestOut = append(i.guestOut, src)
	i.mu.Unlock()
	i.outWG.Add(1)
	go func() {
		defer i.outWG.Done()
		d := dst
		if d == nil {
			d = nopWriteCloser{io.Discard}
		}
		n, err := io.Copy(d, src)
		src.Close()
		i.mu.Lock()
		held, replaced := i.held, i.outGen != gen
		if held && !replaced && dst != nil {
			i.heldEnded = append(i.heldEnded, dst)
		}
		i.mu.Unlock()
		if held || replaced {
			i.log.Debugf("%s: guest stream ended after %d bytes during a rollback; the host end stays", name, n)
			return
		}
		if err != nil && !i.closed.Load() {
			i.log.WithError(err).Warnf("copy %s", name)
		}
		i.log.Debugf("%s: guest stream ended after %d bytes", name, n)
		d.Close()
	}()
}

// copyStdin copies the client's stdin into the current guest stdin stream
// until the client's EOF, which is EOF for the guest process.
func (i *IO) copyStdin() {
	defer close(i.inDone)
	buf := make([]byte, 32<<10)
	for {
		n, rerr := i.stdin.Read(buf)
		if n > 0 && !i.writeGuestIn(buf[:n]) {
			break
		}
		if rerr != nil {
			if rerr != io.EOF && !i.closed.Load() {
				i.log.WithError(rerr).Debug("copy stdin")
			}
			break
		}
	}
	i.mu.Lock()
	g := i.guestIn
	i.mu.Unlock()
	_ = g.CloseWrite()
}

// writeGuestIn writes b to the current guest stdin stream. A write that
// fails during a rollback waits for the new stream (or the hold's release)
// and is written again there.
func (i *IO) writeGuestIn(b []byte) bool {
	for {
		i.mu.Lock()
		g, gen, swap := i.guestIn, i.inGen, i.inSwap
		i.mu.Unlock()
		_, err := g.Write(b)
		if err == nil {
			return true
		}
		if i.closed.Load() {
			return false
		}
		i.mu.Lock()
		changed, held := i.inGen != gen, i.held
		i.mu.Unlock()
		switch {
		case changed:
			continue
		case !held:
			i.log.WithError(err).Debug("copy stdin")
			return false
		}
		<-swap
	}
}

// Hold keeps the host ends open through a rollback (see above).
func (i *IO) Hold() {
	i.mu.Lock()
	i.held = true
	i.mu.Unlock()
}

// Release ends a Hold after a rollback that did not happen.
func (i *IO) Release() {
	i.mu.Lock()
	if !i.held {
		i.mu.Unlock()
		return
	}
	i.held = false
	ended := i.heldEnded
	i.heldEnded = nil
	swap := i.inSwap
	i.inSwap = make(chan struct{})
	i.mu.Unlock()
	if swap != nil {
		close(swap)
	}
	for _, d := range ended {
		d.Close()
	}
}

// Reattach connects the host ends to new guest streams after a rollback
// (nil for a stream the process has not) and ends a Hold. The old guest
// streams are closed.
func (i *IO) Reattach(guestStdin HalfCloser, guestStdout, guestStderr io.ReadCloser) {
	if guestStderr != nil && i.cfg.Terminal {
		guestStderr.Close()
		guestStderr = nil
	}
	i.mu.Lock()
	i.held = false
	i.outGen++
	old := i.guestOut
	i.guestOut = nil
	ended := i.heldEnded
	i.heldEnded = nil
	oldIn := i.guestIn
	if guestStdin != nil {
		i.guestIn = guestStdin
		i.inGen++
	}
	swap := i.inSwap
	i.inSwap = make(chan struct{})
	inDone := i.inDone
	i.mu.Unlock()
	for _, c := range old {
		c.Close()
	}
	if swap != nil {
		close(swap)
	}
	if guestStdin != nil && oldIn != nil {
		oldIn.Close()
	}
	if guestStdout != nil {
		i.pump("stdout", i.stdout, guestStdout)
	}
	if guestStderr != nil {
		i.pump("stderr", i.stderr, guestStderr)
	}
	for _, d := range ended {
		if d == i.stdout && guestStdout != nil || d == i.stderr && guestStderr != nil {
			continue
		}
		d.Close()
	}
	if guestStdin != nil {
		// No copy (no client stdin), or the client's EOF came already: EOF
		// for the new stream too.
		ended := inDone == nil
		if !ended {
			select {
			case <-inDone:
				ended = true
			default:
			}
		}
		if ended {
			_ = guestStdin.CloseWrite()
		}
	}
}
