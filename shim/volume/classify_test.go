package volume

import (
	"regexp"
	"strings"
	"testing"
)

func TestParse(t *testing.T) {
	const pod = "/var/lib/kubelet/pods/0f3c2a9e-1b2c-4d5e-8f90-123456789abc"
	for p, want := range map[string]Path{
		pod + "/volumes/kubernetes.io~empty-dir/cache":                      {Kind: EmptyDir, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "empty-dir", Name: "cache"},
		pod + "/volumes/kubernetes.io~configmap/cfg":                        {Kind: Copied, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "configmap", Name: "cfg"},
		pod + "/volumes/kubernetes.io~secret/tls":                           {Kind: Copied, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "secret", Name: "tls"},
		pod + "/volumes/kubernetes.io~projected/kube-api-access-x7k2p":      {Kind: Copied, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "projected", Name: "kube-api-access-x7k2p"},
		pod + "/volumes/kubernetes.io~downward-api/podinfo":                 {Kind: Copied, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "downward-api", Name: "podinfo"},
		pod + "/volumes/kubernetes.io~csi/pvc-123/mount":                    {Kind: Unsupported, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "csi", Name: "pvc-123"},
		pod + "/volumes/kubernetes.io~nfs/data":                             {Kind: Unsupported, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "nfs", Name: "data"},
		pod + "/volumes/kubernetes.io~configmap/cfg/..data":                 {Kind: Unsupported, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "configmap", Name: "cfg"},
		pod + "/volume-subpaths/cfg/app/0":                                  {Kind: Unsupported, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Plugin: "subPath", Name: "cfg"},
		pod + "/containers/app/5e1f2a3b":                                    {Kind: TerminationLog, PodUID: "0f3c2a9e-1b2c-4d5e-8f90-123456789abc", Name: "app"},
		"/data/kubelet/pods/u1/volumes/kubernetes.io~secret/s":              {Kind: Copied, PodUID: "u1", Plugin: "secret", Name: "s"},
		pod + "/etc-hosts":                                                  {},
		"/var/lib/containerd/io.containerd.grpc.v1.cri/sandboxes/abc/hosts": {},
		"/srv/data": {},
		pod + "/volumes/kubernetes.io~configmap/../../../etc": {},
		pod + "/volumes/kubernetes.io~configmap/.hidden":      {},
		"relative/pods/u/volumes/kubernetes.io~secret/s":      {},
		"": {},
	} {
		if got := Parse(p); got != want {
			t.Errorf("Parse(%q) = %+v, want %+v", p, got, want)
		}
	}
}

func TestDescribeAndGuestDir(t *testing.T) {
	v := Parse("/var/lib/kubelet/pods/u/volumes/kubernetes.io~configmap/cfg")
	if d := v.Describe(); d != `configMap volume "cfg"` {
		t.Errorf("Describe = %q", d)
	}
	if g := v.GuestDir(); g != "/run/cube/volumes/configmap/cfg" {
		t.Errorf("GuestDir = %q", g)
	}
	if d := Parse("/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount").Describe(); !strings.Contains(d, "PersistentVolume") || !strings.Contains(d, `"pv"`) {
		t.Errorf("CSI Describe = %q", d)
	}
}

// Any host path → Parse: never a panic, and whatever it accepts yields
// names that are single safe guest path components.
func FuzzParse(f *testing.F) {
	for _, s := range []string{
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~empty-dir/cache",
		"/var/lib/kubelet/pods/u/volumes/kubernetes.io~csi/pv/mount",
		"/var/lib/kubelet/pods/u/containers/app/1",
		"/var/lib/kubelet/pods/u/volume-subpaths/v/c/0",
		"/x/pods/../volumes/kubernetes.io~secret/..",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, p string) {
		v := Parse(p)
		if v.Kind == Other {
			if v != (Path{}) {
				t.Fatalf("Other with fields: %+v", v)
			}
			return
		}
		for _, n := range []string{v.PodUID, v.Plugin, v.Name} {
			if n == "." || n == ".." || strings.ContainsAny(n, "/\x00") {
				t.Fatalf("Parse(%q) = %+v: unsafe name %q", p, v, n)
			}
		}
		if v.Kind == Copied && !strings.HasPrefix(v.GuestDir(), "/run/cube/volumes/"+v.Plugin+"/") {
			t.Fatalf("GuestDir %q escapes", v.GuestDir())
		}
	})
}

// safeName accepts what the regexp [A-Za-z0-9][A-Za-z0-9._-]{0,252} would,
// whole, and nothing else.
func TestSafeNameIsTheRegexp(t *testing.T) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)
	cases := []string{"", "a", "-a", ".a", "_a", "a-b.c_d", "A9", "a/b", "a b", "é", "a\x00",
		strings.Repeat("a", 253), strings.Repeat("a", 254), "0" + strings.Repeat("-", 252), "0" + strings.Repeat("-", 253),
		"3f2c1a9e-2b4d-4c7e-9a51-0d6b8e2f4a17", "kubernetes.io~empty-dir"}
	for _, c := range cases {
		if got, want := safeName(c), re.MatchString(c); got != want {
			t.Errorf("safeName(%q) = %v, the regexp says %v", c, got, want)
		}
	}
}

func FuzzSafeName(f *testing.F) {
	re := regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,252}$`)
	f.Add("a-b")
	f.Add("-")
	f.Fuzz(func(t *testing.T, s string) {
		if got, want := safeName(s), re.MatchString(s); got != want {
			t.Fatalf("safeName(%q) = %v, the regexp says %v", s, got, want)
		}
	})
}
