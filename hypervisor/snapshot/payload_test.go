package snapshot

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
)

// TestDeviceRecord: version 1's record keeps each kind's state under the
// key it always had, Kind and Transport first; a kind added later uses its
// kind; no state, or null, is none.
func TestDeviceRecord(t *testing.T) {
	for _, c := range []struct {
		d    DeviceState
		want string
	}{
		{DeviceState{Kind: "blk", Transport: json.RawMessage(`{"Version":1}`), State: json.RawMessage(`{"Sectors":8}`)},
			`{"Kind":"blk","Transport":{"Version":1},"Blk":{"Sectors":8}}`},
		{DeviceState{Kind: "vsock", Transport: json.RawMessage(`{}`), State: json.RawMessage(`{}`)}, `{"Kind":"vsock","Transport":{},"Vsock":{}}`},
		{DeviceState{Kind: "rng", Transport: json.RawMessage(`{}`), State: json.RawMessage(`{"Version":1}`)}, `{"Kind":"rng","Transport":{},"RNG":{"Version":1}}`},
		{DeviceState{Kind: "net", Transport: json.RawMessage(`{}`), State: json.RawMessage(`[1]`)}, `{"Kind":"net","Transport":{},"net":[1]}`},
		{DeviceState{Kind: "rng", Transport: json.RawMessage(`{}`)}, `{"Kind":"rng","Transport":{}}`},
	} {
		b, err := json.Marshal(c.d)
		if err != nil || string(b) != c.want {
			t.Errorf("%+v encodes as %s (%v), want %s", c.d, b, err, c.want)
			continue
		}
		var back DeviceState
		if err := json.Unmarshal(b, &back); err != nil || back.Kind != c.d.Kind || string(back.Transport) != string(c.d.Transport) || string(back.State) != string(c.d.State) {
			t.Errorf("%s decodes as %+v (%v)", b, back, err)
		}
	}
	var d DeviceState
	if err := json.Unmarshal([]byte(`{"Kind":"blk","Transport":{},"Blk":null,"Vsock":{}}`), &d); err != nil || d.State != nil {
		t.Errorf("null state: %+v %v, want none", d, err)
	}
	if err := json.Unmarshal([]byte(`{"Kind":7}`), &d); err == nil {
		t.Error("a numeric kind accepted")
	}
}

func validPayload() *State {
	v := VCPU{CPUID: make([]CPUIDEntry, 1), XSave: make([]uint32, 1024)}
	return &State{Version: Version, VCPUs: []VCPU{v}, Serial: json.RawMessage(`{}`),
		Devices: []DeviceState{{Kind: "rng", Transport: json.RawMessage(`{}`), State: json.RawMessage(`{}`)}}}
}

func TestDecodePayload(t *testing.T) {
	b, err := EncodePayload(validPayload())
	if err != nil {
		t.Fatal(err)
	}
	if _, err := DecodePayload(b); err != nil {
		t.Fatalf("DecodePayload(EncodePayload(…)): %v", err)
	}
	for name, c := range map[string]struct {
		mod  func(*State)
		want error
	}{
		"version":        {func(s *State) { s.Version = 2 }, ErrVersion},
		"short xsave":    {func(s *State) { s.VCPUs[0].XSave = s.VCPUs[0].XSave[:1023] }, ErrCorrupt},
		"no cpuid":       {func(s *State) { s.VCPUs[0].CPUID = nil }, ErrCorrupt},
		"too many cpuid": {func(s *State) { s.VCPUs[0].CPUID = make([]CPUIDEntry, MaxCPUIDEntries+1) }, ErrCorrupt},
		"too many msrs":  {func(s *State) { s.VCPUs[0].MSRs = make([]MSR, MaxMSRs+1) }, ErrCorrupt},
		"too many vcpus": {func(s *State) {
			for len(s.VCPUs) <= MaxVCPUs {
				s.VCPUs = append(s.VCPUs, s.VCPUs[0])
			}
		}, ErrCorrupt},
		"no device state": {func(s *State) { s.Devices[0].State = nil }, ErrCorrupt},
		"no transport":    {func(s *State) { s.Devices[0].Transport = nil }, ErrCorrupt},
	} {
		s := validPayload()
		c.mod(s)
		b, err := EncodePayload(s)
		if err != nil {
			t.Fatal(err)
		}
		if _, err := DecodePayload(b); !errors.Is(err, c.want) {
			t.Errorf("%s: %v, want %v", name, err, c.want)
		}
	}
	for _, b := range []string{"", "{", `{"Version":"1"}`, `{"Version":1,"Devices":[7]}`, `[]`} {
		if _, err := DecodePayload([]byte(b)); !errors.Is(err, ErrCorrupt) {
			t.Errorf("DecodePayload(%q): %v, want ErrCorrupt", b, err)
		}
	}
	if _, err := DecodePayload([]byte(`{"Version":1,"Serial":"` + strings.Repeat("A", MaxStateSize) + `"}`)); !errors.Is(err, ErrCorrupt) {
		t.Errorf("oversized payload: %v", err)
	}
}

func FuzzDecodePayload(f *testing.F) {
	b, _ := EncodePayload(validPayload())
	f.Add(b)
	f.Add([]byte(`{"Version":1,"VCPUs":[],"Devices":[]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := DecodePayload(b)
		if err != nil {
			return
		}
		// What decodes re-encodes, and decodes again to the same.
		again, err := EncodePayload(s)
		if err != nil {
			t.Fatalf("accepted payload does not re-encode: %v", err)
		}
		if _, err := DecodePayload(again); err != nil {
			t.Fatalf("re-encoded payload refused: %v", err)
		}
	})
}

func FuzzDecodeBitmap(f *testing.F) {
	f.Add(EncodeBitmap([]uint64{1, 1 << 63}))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		w, err := DecodeBitmap(b)
		if err != nil {
			if len(b)%8 == 0 {
				t.Fatalf("refused %d bytes: %v", len(b), err)
			}
			return
		}
		if string(EncodeBitmap(w)) != string(b) {
			t.Fatal("bitmap does not re-encode to itself")
		}
	})
}
