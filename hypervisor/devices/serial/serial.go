// Package serial emulates a 16550A UART: enough of it for Linux's 8250
// driver to detect a 16550A with FIFOs, print the console and read input.
package serial

import (
	"io"
	"sync"
)

// Register offsets from the port base (COM1 is 0x3f8, IRQ 4).
const (
	regData = 0 // RBR (read) / THR (write); DLL with DLAB
	regIER  = 1 // DLM with DLAB
	regIIR  = 2 // IIR (read) / FCR (write)
	regLCR  = 3
	regMCR  = 4
	regLSR  = 5
	regMSR  = 6
	regSCR  = 7

	// COM1 defaults.
	COM1Base = 0x3f8
	COM1IRQ  = 4
	// Size is the number of ports the UART decodes.
	Size = 8
)

const (
	ierRDA  = 1 << 0 // received data available
	ierTHRE = 1 << 1 // transmitter holding register empty

	iirNone    = 0x01
	iirTHRE    = 0x02
	iirRDA     = 0x04
	iirFIFOsOn = 0xc0

	lcrDLAB = 1 << 7

	mcrDTR  = 1 << 0
	mcrRTS  = 1 << 1
	mcrOUT1 = 1 << 2
	mcrOUT2 = 1 << 3
	mcrLoop = 1 << 4

	lsrDR   = 1 << 0
	lsrTHRE = 1 << 5
	lsrTEMT = 1 << 6

	msrCTS = 1 << 4
	msrDSR = 1 << 5
	msrRI  = 1 << 6
	msrDCD = 1 << 7

	inputMax = 4096 // bytes buffered from the host; more are dropped
)

// Serial is one UART.
type Serial struct {
	mu  sync.Mutex
	st  State
	out io.Writer
	irq func() // raises the UART's (edge-triggered ISA) interrupt
}

// New returns a UART writing transmitted bytes to out and calling irq
// when an enabled interrupt condition arises. irq may be nil.
func New(out io.Writer, irq func()) *Serial {
	if out == nil {
		out = io.Discard
	}
	// DLL 12 = 9600 baud, the 8250 reset value Linux expects to read back.
	return &Serial{out: out, irq: irq, st: State{DLL: 12}}
}

// Enqueue feeds host input to the guest (as if received on the line).
func (s *Serial) Enqueue(b []byte) {
	s.mu.Lock()
	room := inputMax - len(s.st.Input)
	if room < len(b) {
		b = b[:max(room, 0)]
	}
	s.st.Input = append(s.st.Input, b...)
	raise := len(b) > 0 && s.st.IER&ierRDA != 0
	s.mu.Unlock()
	if raise {
		s.interrupt()
	}
}

func (s *Serial) interrupt() {
	if s.irq != nil {
		s.irq()
	}
}

// Read implements bus.Device.
func (s *Serial) Read(off uint64, data []byte) {
	for i := range data {
		data[i] = 0
	}
	if len(data) == 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	st := &s.st
	var v byte
	switch off {
	case regData:
		if st.LCR&lcrDLAB != 0 {
			v = st.DLL
		} else if len(st.Input) > 0 {
			v = st.Input[0]
			st.Input = st.Input[1:]
		}
	case regIER:
		if st.LCR&lcrDLAB != 0 {
			v = st.DLM
		} else {
			v = st.IER
		}
	case regIIR:
		v = iirNone
		switch {
		case st.IER&ierRDA != 0 && len(st.Input) > 0:
			v = iirRDA
		case st.THREPending:
			v = iirTHRE
			// Reading IIR acknowledges a THRE interrupt.
			st.THREPending = false
		}
		if st.FCR&1 != 0 {
			v |= iirFIFOsOn
		}
	case regLCR:
		v = st.LCR
	case regMCR:
		v = st.MCR
	case regLSR:
		v = lsrTHRE | lsrTEMT
		if len(st.Input) > 0 {
			v |= lsrDR
		}
	case regMSR:
		if st.MCR&mcrLoop != 0 {
			// Loopback wires the modem outputs to the inputs; the 8250
			// driver's probe checks this.
			if st.MCR&mcrDTR != 0 {
				v |= msrDSR
			}
			if st.MCR&mcrRTS != 0 {
				v |= msrCTS
			}
			if st.MCR&mcrOUT1 != 0 {
				v |= msrRI
			}
			if st.MCR&mcrOUT2 != 0 {
				v |= msrDCD
			}
		} else {
			v = msrDCD | msrDSR | msrCTS
		}
	case regSCR:
		v = st.SCR
	}
	data[0] = v
}

// Write implements bus.Device.
func (s *Serial) Write(off uint64, data []byte) {
	if len(data) == 0 {
		return
	}
	v := data[0]
	s.mu.Lock()
	st := &s.st
	raise := false
	var out []byte
	switch off {
	case regData:
		if st.LCR&lcrDLAB != 0 {
			st.DLL = v
			break
		}
		if st.MCR&mcrLoop != 0 {
			if len(st.Input) < inputMax {
				st.Input = append(st.Input, v)
			}
			raise = st.IER&ierRDA != 0
		} else {
			out = []byte{v}
		}
		// The byte leaves at once, so THR is empty again.
		if st.IER&ierTHRE != 0 {
			st.THREPending = true
			raise = true
		}
	case regIER:
		if st.LCR&lcrDLAB != 0 {
			st.DLM = v
			break
		}
		was := st.IER
		st.IER = v & 0x0f
		if st.IER&ierTHRE == 0 {
			st.THREPending = false // source disabled: nothing pending
		}
		// Enabling THRE while THR is empty interrupts immediately.
		if st.IER&ierTHRE != 0 && was&ierTHRE == 0 {
			st.THREPending = true
			raise = true
		}
		if st.IER&ierRDA != 0 && len(st.Input) > 0 {
			raise = true
		}
	case regIIR:
		st.FCR = v
		if v&0x02 != 0 { // clear receive FIFO
			st.Input = nil
		}
	case regLCR:
		st.LCR = v
	case regMCR:
		st.MCR = v & 0x1f
	case regSCR:
		st.SCR = v
	}
	s.mu.Unlock()
	// Output and interrupt outside the lock: the writer may block.
	if out != nil {
		s.out.Write(out)
	}
	if raise {
		s.interrupt()
	}
}
