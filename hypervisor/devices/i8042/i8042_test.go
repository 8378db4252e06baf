package i8042

import "testing"

func TestReset(t *testing.T) {
	resets := 0
	d := &Device{OnReset: func() { resets++ }}
	st := []byte{0xff}
	d.Read(offCommand, st)
	if st[0]&0x02 != 0 {
		t.Fatalf("status %#x: input buffer full would make Linux wait", st[0])
	}
	d.Write(offData, []byte{cmdReset})
	d.Write(offCommand, []byte{0xd1})
	if resets != 0 {
		t.Fatal("reset on the wrong port or command")
	}
	d.Write(offCommand, []byte{cmdReset})
	if resets != 1 {
		t.Fatalf("resets = %d", resets)
	}
	(&Device{}).Write(offCommand, []byte{cmdReset}) // no callback: no panic
	d.Write(offCommand, nil)
}
