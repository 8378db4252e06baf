package snapshot

import (
	"bytes"
	"encoding/json"
	"fmt"
)

// State is the state file's payload: everything of a VM that is not guest
// memory or disk contents. Version 1 encodes it, and every device state in
// it, as JSON with the names below.
type State struct {
	Version   int     `json:"Version"` // Version
	VCPUs     []VCPU  `json:"VCPUs"`
	PICMaster IRQChip `json:"PICMaster"`
	PICSlave  IRQChip `json:"PICSlave"`
	IOAPIC    IRQChip `json:"IOAPIC"`
	PIT       PIT     `json:"PIT"`
	Clock     Clock   `json:"Clock"`
	// Serial is the UART's state as the serial device saved it.
	Serial json.RawMessage `json:"Serial"`
	// Devices are the virtio devices, in attach (PCI) order.
	Devices []DeviceState `json:"Devices"`
	// VMGenID is the VM generation id device's state as it saved it; nil
	// (omitted) for a VM without one, as every snapshot before it had.
	VMGenID json.RawMessage `json:"VMGenID,omitempty"`
}

// DeviceState is one virtio device's record: its kind, its transport's state
// and its own, each as the device saved it.
//
// Version 1 stores the device's state under a key named after its kind (see
// stateKey): {"Kind":"blk","Transport":{…},"Blk":{…}}.
type DeviceState struct {
	Kind      string
	Transport json.RawMessage
	State     json.RawMessage // nil: the record has none
}

// Device is a device with state in a snapshot. Each device's state struct,
// with these three methods, is in a state.go beside the device.
type Device interface {
	// StateKind names the kind of state the device saves ("blk"); a
	// restore gives a device only a state of its own kind.
	StateKind() string
	// SaveState returns the device's state (see Save). The caller has
	// quiesced the device: vCPUs parked, transports paused.
	SaveState() ([]byte, error)
	// RestoreState loads a state SaveState returned, after checking its
	// version and that it fits this device; on error the device is as
	// before the call.
	RestoreState([]byte) error
}

// Save encodes a device's state struct, as SaveState returns it.
func Save(v any) ([]byte, error) {
	b, err := json.Marshal(v)
	if err != nil {
		return nil, fmt.Errorf("encode %T: %w", v, err)
	}
	return b, nil
}

// Load decodes a device's state, as Save encoded it, into v. Anything that
// does not decode is ErrCorrupt; the version is the caller's to check.
func Load(b []byte, v any) error {
	if len(b) > MaxStateSize {
		return fmt.Errorf("device state of %d bytes: %w", len(b), ErrCorrupt)
	}
	if err := json.Unmarshal(b, v); err != nil {
		return fmt.Errorf("device state: %v: %w", err, ErrCorrupt)
	}
	return nil
}

// v1StateKeys are the keys version 1 gave the three device kinds it had
// (the Go field names of the record struct); a kind added later is stored
// under its kind.
var v1StateKeys = map[string]string{"blk": "Blk", "vsock": "Vsock", "rng": "RNG"}

func stateKey(kind string) string {
	if k, ok := v1StateKeys[kind]; ok {
		return k
	}
	return kind
}

// MarshalJSON writes Kind, Transport, then the state under its kind's key
// (omitted when nil), the order version 1 has.
func (d DeviceState) MarshalJSON() ([]byte, error) {
	var b bytes.Buffer
	b.WriteString(`{"Kind":`)
	if err := appendJSON(&b, d.Kind); err != nil {
		return nil, err
	}
	b.WriteString(`,"Transport":`)
	if err := appendJSON(&b, d.Transport); err != nil {
		return nil, err
	}
	if d.State != nil {
		b.WriteByte(',')
		if err := appendJSON(&b, stateKey(d.Kind)); err != nil {
			return nil, err
		}
		b.WriteByte(':')
		if err := appendJSON(&b, d.State); err != nil {
			return nil, err
		}
	}
	b.WriteByte('}')
	return b.Bytes(), nil
}

func appendJSON(b *bytes.Buffer, v any) error {
	j, err := json.Marshal(v)
	if err != nil {
		return err
	}
	b.Write(j)
	return nil
}

// UnmarshalJSON reads a record MarshalJSON wrote; other keys are ignored, a
// state that is JSON null counts as none.
func (d *DeviceState) UnmarshalJSON(b []byte) error {
	var rec map[string]json.RawMessage
	if err := json.Unmarshal(b, &rec); err != nil {
		return err
	}
	var kind string
	if k, ok := rec["Kind"]; ok {
		if err := json.Unmarshal(k, &kind); err != nil {
			return fmt.Errorf("device kind: %w", err)
		}
	}
	*d = DeviceState{Kind: kind, Transport: nonNull(rec["Transport"]), State: nonNull(rec[stateKey(kind)])}
	return nil
}

func nonNull(r json.RawMessage) json.RawMessage {
	if len(r) == 0 || string(r) == "null" {
		return nil
	}
	return r
}

// maxDevices bounds the device records of a payload.
const maxDevices = 256

// EncodePayload encodes a state as the state file's payload (EncodeState
// frames it).
func EncodePayload(s *State) ([]byte, error) {
	b, err := json.Marshal(s)
	if err != nil {
		return nil, fmt.Errorf("encode state: %w", err)
	}
	return b, nil
}

// DecodePayload decodes a state file's payload and checks what it can
// without a machine: the version, and the bounds of every list in it. The
// device states are checked by the devices that restore them.
func DecodePayload(b []byte) (*State, error) {
	if len(b) > MaxStateSize {
		return nil, fmt.Errorf("state of %d bytes: %w", len(b), ErrCorrupt)
	}
	var s State
	if err := json.Unmarshal(b, &s); err != nil {
		return nil, fmt.Errorf("state: %v: %w", err, ErrCorrupt)
	}
	if s.Version != Version {
		return nil, fmt.Errorf("machine state version %d, this build reads %d: %w", s.Version, Version, ErrVersion)
	}
	if len(s.VCPUs) > MaxVCPUs || len(s.Devices) > maxDevices {
		return nil, fmt.Errorf("state has %d vCPUs, %d devices: %w", len(s.VCPUs), len(s.Devices), ErrCorrupt)
	}
	for i, v := range s.VCPUs {
		if len(v.XSave) < minXSaveWords || len(v.XSave) > maxXSaveWords {
			return nil, fmt.Errorf("vcpu %d: xsave of %d words: %w", i, len(v.XSave), ErrCorrupt)
		}
		if len(v.CPUID) == 0 || len(v.CPUID) > MaxCPUIDEntries || len(v.MSRs) > MaxMSRs {
			return nil, fmt.Errorf("vcpu %d: %d cpuid entries, %d msrs: %w", i, len(v.CPUID), len(v.MSRs), ErrCorrupt)
		}
	}
	for i, d := range s.Devices {
		if d.Transport == nil || d.State == nil {
			return nil, fmt.Errorf("device %d: no %s state: %w", i, d.Kind, ErrCorrupt)
		}
	}
	return &s, nil
}
