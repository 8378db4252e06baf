package cubetest

import (
	"archive/tar"
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"fmt"
	"os"
	"time"
)

// OCIImageTar writes a single-layer OCI image layout tar of busybox (for
// `ctr images import`): the layer holds /bin/busybox and applet links. cmd
// is the image's command (default /bin/sh).
func OCIImageTar(busybox, name string, applets []string, cmd ...string) ([]byte, error) {
	if len(cmd) == 0 {
		cmd = []string{"/bin/sh"}
	}
	bb, err := os.ReadFile(busybox)
	if err != nil {
		return nil, err
	}
	var layer bytes.Buffer
	lw := tar.NewWriter(&layer)
	now := time.Unix(0, 0)
	for _, d := range []string{"bin/", "etc/", "proc/", "sys/", "dev/", "tmp/", "root/"} {
		if err := lw.WriteHeader(&tar.Header{Name: d, Typeflag: tar.TypeDir, Mode: 0o755, ModTime: now}); err != nil {
			return nil, err
		}
	}
	if err := lw.WriteHeader(&tar.Header{Name: "bin/busybox", Typeflag: tar.TypeReg, Mode: 0o755, Size: int64(len(bb)), ModTime: now}); err != nil {
		return nil, err
	}
	lw.Write(bb)
	for _, a := range applets {
		if err := lw.WriteHeader(&tar.Header{Name: "bin/" + a, Typeflag: tar.TypeSymlink, Linkname: "busybox", Mode: 0o777, ModTime: now}); err != nil {
			return nil, err
		}
	}
	motd := []byte("from the image layer\n")
	lw.WriteHeader(&tar.Header{Name: "etc/motd", Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(motd)), ModTime: now})
	lw.Write(motd)
	if err := lw.Close(); err != nil {
		return nil, err
	}

	var out bytes.Buffer
	ow := tar.NewWriter(&out)
	put := func(path string, b []byte) error {
		if err := ow.WriteHeader(&tar.Header{Name: path, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(b)), ModTime: now}); err != nil {
			return err
		}
		_, err := ow.Write(b)
		return err
	}
	type desc struct {
		MediaType   string            `json:"mediaType"`
		Digest      string            `json:"digest"`
		Size        int               `json:"size"`
		Annotations map[string]string `json:"annotations,omitempty"`
	}
	blob := func(mt string, b []byte) (desc, error) {
		d := desc{MediaType: mt, Digest: fmt.Sprintf("sha256:%x", sha256.Sum256(b)), Size: len(b)}
		return d, put("blobs/sha256/"+d.Digest[len("sha256:"):], b)
	}
	layerDesc, err := blob("application/vnd.oci.image.layer.v1.tar", layer.Bytes())
	if err != nil {
		return nil, err
	}
	cfg, _ := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Cmd": cmd, "Env": []string{"PATH=/bin"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{layerDesc.Digest}},
	})
	cfgDesc, err := blob("application/vnd.oci.image.config.v1+json", cfg)
	if err != nil {
		return nil, err
	}
	man, _ := json.Marshal(map[string]any{
		"schemaVersion": 2, "mediaType": "application/vnd.oci.image.manifest.v1+json",
		"config": cfgDesc, "layers": []desc{layerDesc},
	})
	manDesc, err := blob("application/vnd.oci.image.manifest.v1+json", man)
	if err != nil {
		return nil, err
	}
	manDesc.Annotations = map[string]string{"io.containerd.image.name": name, "org.opencontainers.image.ref.name": "latest"}
	idx, _ := json.Marshal(map[string]any{"schemaVersion": 2, "mediaType": "application/vnd.oci.image.index.v1+json", "manifests": []desc{manDesc}})
	if err := put("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return nil, err
	}
	if err := put("index.json", idx); err != nil {
		return nil, err
	}
	if err := ow.Close(); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}
