package serial

// State is the UART's register file, serializable for snapshots.
type State struct {
	IER, LCR, MCR, SCR, FCR uint8
	DLL, DLM                uint8
	THREPending             bool
	Input                   []byte
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
