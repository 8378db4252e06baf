// Package volume decides what a host bind mount of a container spec is —
// a kubelet volume (emptyDir, configMap, secret, projected, downwardAPI,
// another plugin), a file the kubelet or CRI made for the pod, or some
// other host path — and keeps the guest's copies of host volumes in sync
// with the host (Syncer). The task service (shim/task) turns the
// classification into guest mounts; docs/shim.md, "Volumes", says why.
package volume

import (
	"path"
	"regexp"
	"strings"
)

// Kind is what a host path is, as far as its path tells.
type Kind int

const (
	// Other: not a path the kubelet makes for a pod's volume or container.
	Other Kind = iota
	// EmptyDir: .../pods/<uid>/volumes/kubernetes.io~empty-dir/<name>.
	EmptyDir
	// Copied: a configMap, secret, projected or downwardAPI volume: a small
	// tree the kubelet writes and swaps atomically.
	Copied
	// Unsupported: another kubelet volume plugin (csi, nfs, local, …) or a
	// directory inside a volume (a subPath, a CSI mount dir).
	Unsupported
	// TerminationLog: .../pods/<uid>/containers/<container>/<id>, the file
	// the container writes its termination message into and the kubelet
	// reads after it ended.
	TerminationLog
)

func (k Kind) String() string {
	switch k {
	case EmptyDir:
		return "emptyDir"
	case Copied:
		return "copied"
	case Unsupported:
		return "unsupported"
	case TerminationLog:
		return "termination log"
	}
	return "other"
}

// Path is a host path parsed.
type Path struct {
	Kind Kind
	// PodUID, and for volumes Plugin (the kubelet's name without
	// "kubernetes.io~": configmap, secret, …) and Name (the volume's name in
	// the pod spec); for a termination log Name is the container's name.
	PodUID, Plugin, Name string
}

// copiedPlugins are the kubelet volume plugins whose trees are copied in.
var copiedPlugins = map[string]bool{"configmap": true, "secret": true, "projected": true, "downward-api": true}

var (
	// The kubelet's root dir is configurable (--root-dir): any prefix.
	volumePath  = regexp.MustCompile(`^/.*/pods/([^/]+)/volumes/kubernetes\.io~([^/]+)/([^/]+)(/.*)?$`)
	subPathPath = regexp.MustCompile(`^/.*/pods/([^/]+)/volume-subpaths/([^/]+)/[^/]+/[^/]+$`)
	termLogPath = regexp.MustCompile(`^/.*/pods/([^/]+)/containers/([^/]+)/([^/]+)$`)
)

// Parse classifies a host path by its shape. A path that is not clean, or
// whose names could not be guest path components, is Other.
func Parse(p string) Path {
	if p == "" || path.Clean(p) != p || strings.ContainsRune(p, 0) {
		return Path{}
	}
	if m := volumePath.FindStringSubmatch(p); m != nil {
		uid, plugin, name, rest := m[1], m[2], m[3], m[4]
		if !safeName(uid) || !safeName(plugin) || !safeName(name) {
			return Path{}
		}
		v := Path{Kind: Unsupported, PodUID: uid, Plugin: plugin, Name: name}
		switch {
		case rest != "":
		case plugin == "empty-dir":
			v.Kind = EmptyDir
		case copiedPlugins[plugin]:
			v.Kind = Copied
		}
		return v
	}
	if m := subPathPath.FindStringSubmatch(p); m != nil && safeName(m[1]) && safeName(m[2]) {
		return Path{Kind: Unsupported, PodUID: m[1], Plugin: "subPath", Name: m[2]}
	}
	if m := termLogPath.FindStringSubmatch(p); m != nil && safeName(m[1]) && safeName(m[2]) && safeName(m[3]) {
		return Path{Kind: TerminationLog, PodUID: m[1], Name: m[2]}
	}
	return Path{}
}

// Describe names the volume for an error message: `configMap volume "cfg"`.
func (v Path) Describe() string {
	if v.Kind == Other || v.Kind == TerminationLog {
		return ""
	}
	names := map[string]string{"empty-dir": "emptyDir", "configmap": "configMap", "downward-api": "downwardAPI",
		"host-path": "hostPath", "local-volume": "local", "csi": "CSI (a PersistentVolume)"}
	kind, ok := names[v.Plugin]
	if !ok {
		kind = v.Plugin
	}
	return kind + " volume " + `"` + v.Name + `"`
}

// GuestDir is where a copied volume lives in the guest (one pod per VM, so
// plugin and name are unique), under /run/cube/volumes.
func (v Path) GuestDir() string {
	return path.Join("/run/cube/volumes", v.Plugin, v.Name)
}

// safeName says whether s may become a guest path component (Kubernetes
// names are DNS labels, uids hex and dashes): [A-Za-z0-9][A-Za-z0-9._-]{0,252},
// whole. A function, not a regexp: the bounded repeat compiled to a program
// of 253 copies at every shim start (0.85 ms natively, a third of the
// shim's package initialisation).
func safeName(s string) bool {
	if len(s) == 0 || len(s) > 253 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		alnum := c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
		if !alnum && (i == 0 || c != '.' && c != '_' && c != '-') {
			return false
		}
	}
	return true
}
