package serial

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
