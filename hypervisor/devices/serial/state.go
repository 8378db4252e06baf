package serial

import (
	"fmt"

	"github.com/cube-runtime/cube/hypervisor/snapshot"
)

// State is the UART's register file, serializable for snapshots.
// Its json names are the snapshot format's: changing one is a snapshot.Version bump.
type State struct {
	IER         uint8  `json:"IER"`
	LCR         uint8  `json:"LCR"`
	MCR         uint8  `json:"MCR"`
	SCR         uint8  `json:"SCR"`
	FCR         uint8  `json:"FCR"`
	DLL         uint8  `json:"DLL"`
	DLM         uint8  `json:"DLM"`
	THREPending bool   `json:"THREPending"`
	Input       []byte `json:"Input"`
}

// State returns a copy of the register state.
func (s *Serial) State() State {
	s.mu.Lock()
	defer s.mu.Unlock()
	st := s.st
	st.Input = append([]byte(nil), s.st.Input...)
	return st
}

// SetState restores registers saved by State.
func (s *Serial) SetState(st State) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.st = st
	s.st.Input = append([]byte(nil), st.Input...)
}

// Kind is the UART's kind in a snapshot.
const Kind = "serial"

// maxSavedInput bounds the host input a saved state may hold (the UART
// buffers inputMax; older states are not refused for less than this).
const maxSavedInput = 1 << 20

// StateKind is the UART's kind in a snapshot (snapshot.Device).
func (s *Serial) StateKind() string { return Kind }

// SaveState returns the register state (snapshot.Device).
func (s *Serial) SaveState() ([]byte, error) { return snapshot.Save(s.State()) }

// RestoreState loads a state SaveState returned (snapshot.Device).
func (s *Serial) RestoreState(b []byte) error {
	var st State
	if err := snapshot.Load(b, &st); err != nil {
		return fmt.Errorf("restore serial: %w", err)
	}
	if len(st.Input) > maxSavedInput {
		return fmt.Errorf("restore serial: input of %d bytes: %w", len(st.Input), snapshot.ErrCorrupt)
	}
	s.SetState(st)
	return nil
}
