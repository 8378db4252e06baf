package container

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"

	specs "github.com/opencontainers/runtime-spec/specs-go"
)

func validSpec() *specs.Spec {
	return &specs.Spec{
		Version:  specs.Version,
		Process:  &specs.Process{Args: []string{"/bin/true"}, Cwd: "/", Env: []string{"PATH=/bin"}},
		Root:     &specs.Root{Path: "/run/rootfs"},
		Hostname: "box",
		Linux: &specs.Linux{Namespaces: []specs.LinuxNamespace{
			{Type: specs.MountNamespace}, {Type: specs.PIDNamespace}, {Type: specs.UTSNamespace},
		}},
	}
}

func TestValidateSpec(t *testing.T) {
	if err := ValidateSpec(validSpec()); err != nil {
		t.Fatalf("valid spec rejected: %v", err)
	}
	cases := map[string]struct {
		edit func(*specs.Spec)
		want string
	}{
		"no process":   {func(s *specs.Spec) { s.Process = nil }, "spec.process is missing"},
		"no args":      {func(s *specs.Spec) { s.Process.Args = nil }, "process.args is empty"},
		"relative cwd": {func(s *specs.Spec) { s.Process.Cwd = "tmp" }, "process.cwd \"tmp\""},
		"bad env":      {func(s *specs.Spec) { s.Process.Env = []string{"NOEQUALS"} }, "process.env[0]"},
		"user ns": {func(s *specs.Spec) {
			s.Linux.Namespaces = append(s.Linux.Namespaces, specs.LinuxNamespace{Type: specs.UserNamespace})
		}, "user namespaces are not supported"},
		"no mount ns": {func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[1:] }, "must include a mount namespace"},
		"bad rlimit":  {func(s *specs.Spec) { s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_FOO"}} }, "unknown type \"RLIMIT_FOO\""},
		"soft > hard": {func(s *specs.Spec) {
			s.Process.Rlimits = []specs.POSIXRlimit{{Type: "RLIMIT_NOFILE", Soft: 2, Hard: 1}}
		}, "soft limit 2 above hard limit 1"},
		"rel mount":    {func(s *specs.Spec) { s.Mounts = []specs.Mount{{Destination: "proc", Type: "proc"}} }, "destination \"proc\" is not absolute"},
		"no linux":     {func(s *specs.Spec) { s.Linux = nil }, "spec.linux is missing"},
		"hostname/uts": {func(s *specs.Spec) { s.Linux.Namespaces = s.Linux.Namespaces[:2] }, "no uts namespace"},
	}
	for name, c := range cases {
		s := validSpec()
		c.edit(s)
		err := ValidateSpec(s)
		if err == nil || !errors.Is(err, ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: got %v, want invalid error containing %q", name, err, c.want)
		}
	}
}

func TestDecodeSpecRejectsGarbage(t *testing.T) {
	for _, in := range []string{"", "{", "[]", `{"process":1}`} {
		if _, err := DecodeSpec([]byte(in)); !errors.Is(err, ErrInvalid) {
			t.Errorf("DecodeSpec(%q) = %v, want ErrInvalid", in, err)
		}
	}
}

func FuzzDecodeSpec(f *testing.F) {
	b, _ := json.Marshal(validSpec())
	f.Add(b)
	f.Add([]byte(`{"process":{"args":["sh"],"cwd":"/"},"linux":{"namespaces":[{"type":"mount"}]}}`))
	f.Add([]byte(`{}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		s, err := DecodeSpec(data)
		if err == nil {
			// Whatever passes validation must be usable without panics.
			_ = CloneFlags(s)
			if len(s.Process.Args) == 0 {
				t.Fatal("validated spec without args")
			}
		}
	})
}

func FuzzDecodeProcess(f *testing.F) {
	f.Add([]byte(`{"args":["sh","-c","echo"],"cwd":"/","env":["A=b"],"rlimits":[{"type":"RLIMIT_NOFILE","soft":1,"hard":2}]}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		DecodeProcess(data)
	})
}

func TestNewNetns(t *testing.T) {
	ns := func(n ...specs.LinuxNamespace) *specs.Spec {
		return &specs.Spec{Linux: &specs.Linux{Namespaces: append([]specs.LinuxNamespace{{Type: specs.MountNamespace}}, n...)}}
	}
	for _, c := range []struct {
		name string
		spec *specs.Spec
		want bool
	}{
		{"no network namespace: the guest's", ns(), false},
		{"new network namespace", ns(specs.LinuxNamespace{Type: specs.NetworkNamespace}), true},
		{"joined network namespace (a pod's)", ns(specs.LinuxNamespace{Type: specs.NetworkNamespace, Path: "/proc/7/ns/net"}), false},
		{"other new namespaces only", ns(specs.LinuxNamespace{Type: specs.UTSNamespace}, specs.LinuxNamespace{Type: specs.PIDNamespace}), false},
		{"no linux section", &specs.Spec{}, false},
	} {
		if got := NewNetns(c.spec); got != c.want {
			t.Errorf("%s: NewNetns = %v, want %v", c.name, got, c.want)
		}
	}
}
