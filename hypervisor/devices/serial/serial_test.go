package serial

import (
	"bytes"
	"testing"
)

func rd(s *Serial, off uint64) byte {
	b := []byte{0xaa}
	s.Read(off, b)
	return b[0]
}

func wr(s *Serial, off uint64, v byte) { s.Write(off, []byte{v}) }

func TestTransmitAndInterrupts(t *testing.T) {
	var out bytes.Buffer
	irqs := 0
	s := New(&out, func() { irqs++ })
	for _, c := range []byte("hi") {
		wr(s, regData, c)
	}
	if out.String() != "hi" || irqs != 0 {
		t.Fatalf("out %q irqs %d", out.String(), irqs)
	}
	if lsr := rd(s, regLSR); lsr&(lsrTHRE|lsrTEMT) != lsrTHRE|lsrTEMT {
		t.Errorf("LSR %#x: transmitter should be empty", lsr)
	}
	wr(s, regIER, ierTHRE)
	if irqs != 1 || rd(s, regIIR)&0x0f != iirTHRE {
		t.Errorf("enabling THRE: irqs %d", irqs)
	}
	if iir := rd(s, regIIR); iir&0x0f != iirNone {
		t.Errorf("IIR after ack %#x", iir)
	}
	wr(s, regData, '!')
	if irqs != 2 {
		t.Errorf("THRE after transmit: irqs %d", irqs)
	}
}

func TestReceive(t *testing.T) {
	irqs := 0
	s := New(nil, func() { irqs++ })
	s.Enqueue([]byte("ab"))
	if irqs != 0 {
		t.Error("interrupt with RDA disabled")
	}
	wr(s, regIER, ierRDA)
	if irqs != 1 {
		t.Errorf("enabling RDA with data pending: irqs %d", irqs)
	}
	if rd(s, regLSR)&lsrDR == 0 || rd(s, regIIR)&0x0f != iirRDA {
		t.Error("data ready not reported")
	}
	if a, b := rd(s, regData), rd(s, regData); a != 'a' || b != 'b' {
		t.Errorf("read %c%c", a, b)
	}
	if rd(s, regLSR)&lsrDR != 0 {
		t.Error("DR still set after draining")
	}
	s.Enqueue(make([]byte, 2*inputMax))
	if n := len(s.State().Input); n != inputMax {
		t.Errorf("input buffered %d bytes, want cap %d", n, inputMax)
	}
}

// The Linux 8250 probe: scratch register, loopback MSR, FIFO detection,
// divisor latch.
func TestLinuxProbe(t *testing.T) {
	s := New(nil, nil)
	wr(s, regSCR, 0x5a)
	if rd(s, regSCR) != 0x5a {
		t.Error("scratch register")
	}
	wr(s, regMCR, mcrLoop|mcrOUT2|mcrRTS)
	if msr := rd(s, regMSR) & 0xf0; msr != msrDCD|msrCTS {
		t.Errorf("loopback MSR %#x", msr)
	}
	wr(s, regData, 'x')
	if rd(s, regData) != 'x' {
		t.Error("loopback data")
	}
	wr(s, regMCR, 0)
	wr(s, regIIR, 0xe7)
	if rd(s, regIIR)&0xc0 != 0xc0 {
		t.Error("FIFOs not reported: would probe as a 16450")
	}
	wr(s, regLCR, lcrDLAB)
	wr(s, regData, 1)
	wr(s, regIER, 0)
	if rd(s, regData) != 1 || rd(s, regIER) != 0 {
		t.Error("divisor latch")
	}
}

func TestNoPanicOnOddAccesses(t *testing.T) {
	s := New(nil, nil)
	for off := uint64(0); off < 16; off++ {
		s.Read(off, nil)
		s.Write(off, nil)
		s.Read(off, make([]byte, 4))
		s.Write(off, []byte{0xff, 0xff})
	}
}

// FuzzRegisterAccess drives the UART with arbitrary guest accesses.
func FuzzRegisterAccess(f *testing.F) {
	f.Add([]byte{0x03, 0x80, 0x00, 0x01, 0x01, 0x02, 0x04, 0x10})
	f.Add([]byte{0x81, 0x02, 0x00, 0xff})
	f.Fuzz(func(t *testing.T, ops []byte) {
		var out bytes.Buffer
		s := New(&out, func() {})
		for i := 0; i+1 < len(ops); i += 2 {
			off := uint64(ops[i] & 0x0f)
			if ops[i]&0x80 != 0 {
				s.Write(off, ops[i+1:i+2])
			} else {
				b := make([]byte, 1+int(ops[i+1]%4))
				s.Read(off, b)
			}
			if ops[i]&0x40 != 0 {
				s.Enqueue(ops[i+1 : i+2])
			}
		}
		if len(s.State().Input) > inputMax {
			t.Fatalf("input grew to %d", len(s.State().Input))
		}
	})
}
