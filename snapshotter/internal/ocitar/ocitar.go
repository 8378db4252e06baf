// Package ocitar writes a tiny OCI image layout, as the tar stream that
// `ctr images import` reads, from in-memory layers. Tests use it to build
// images locally: there is no registry on our machines.
package ocitar

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"fmt"
	"io"
	"runtime"
	"time"

	"github.com/opencontainers/go-digest"
	specs "github.com/opencontainers/image-spec/specs-go"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Entry is one file, directory, symlink or whiteout in a layer.
type Entry struct {
	Name     string // path inside the image, without leading "/"
	Mode     int64  // permission bits
	Dir      bool
	Linkname string // non-empty: a symlink to Linkname
	Data     []byte // regular file contents
}

// Whiteout returns the entry that deletes name (from a lower layer) in an OCI layer.
func Whiteout(dir, base string) Entry {
	n := ".wh." + base
	if dir != "" {
		n = dir + "/" + n
	}
	return Entry{Name: n, Mode: 0o644}
}

// Image is an image to write: a reference name, a command and layers bottom-up.
type Image struct {
	Name   string // e.g. "docker.io/cube/test:latest"
	Cmd    []string
	Layers [][]Entry
}

var epoch = time.Unix(0, 0).UTC()

func layerTar(entries []Entry) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	for _, e := range entries {
		h := &tar.Header{Name: e.Name, Mode: e.Mode, ModTime: epoch, Format: tar.FormatPAX}
		switch {
		case e.Dir:
			h.Typeflag, h.Name = tar.TypeDir, e.Name+"/"
		case e.Linkname != "":
			h.Typeflag, h.Linkname = tar.TypeSymlink, e.Linkname
		default:
			h.Typeflag, h.Size = tar.TypeReg, int64(len(e.Data))
		}
		if err := tw.WriteHeader(h); err != nil {
			return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
		}
		if h.Typeflag == tar.TypeReg {
			if _, err := tw.Write(e.Data); err != nil {
				return nil, fmt.Errorf("layer entry %s: %w", e.Name, err)
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// Write writes img as an OCI layout tar (gzip layers) to w.
func Write(w io.Writer, img Image) error {
	out := tar.NewWriter(w)
	add := func(name string, data []byte) error {
		if err := out.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(data)), ModTime: epoch, Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		_, err := out.Write(data)
		return err
	}
	blob := func(mediaType string, data []byte) (ocispec.Descriptor, error) {
		d := digest.FromBytes(data)
		return ocispec.Descriptor{MediaType: mediaType, Digest: d, Size: int64(len(data))},
			add("blobs/sha256/"+d.Encoded(), data)
	}
	if err := out.WriteHeader(&tar.Header{Name: "blobs/sha256/", Mode: 0o755, Typeflag: tar.TypeDir, ModTime: epoch}); err != nil {
		return err
	}
	var layers []ocispec.Descriptor
	var diffIDs []digest.Digest
	for i, entries := range img.Layers {
		raw, err := layerTar(entries)
		if err != nil {
			return fmt.Errorf("layer %d: %w", i, err)
		}
		var gz bytes.Buffer
		zw := gzip.NewWriter(&gz)
		if _, err := zw.Write(raw); err != nil {
			return err
		}
		if err := zw.Close(); err != nil {
			return err
		}
		d, err := blob(ocispec.MediaTypeImageLayerGzip, gz.Bytes())
		if err != nil {
			return err
		}
		layers = append(layers, d)
		diffIDs = append(diffIDs, digest.FromBytes(raw))
	}
	cfg, err := json.Marshal(ocispec.Image{
		Created:  &epoch,
		Platform: ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"},
		Config:   ocispec.ImageConfig{Cmd: img.Cmd, Env: []string{"PATH=/bin"}},
		RootFS:   ocispec.RootFS{Type: "layers", DiffIDs: diffIDs},
	})
	if err != nil {
		return err
	}
	cfgDesc, err := blob(ocispec.MediaTypeImageConfig, cfg)
	if err != nil {
		return err
	}
	man, err := json.Marshal(ocispec.Manifest{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageManifest,
		Config: cfgDesc, Layers: layers,
	})
	if err != nil {
		return err
	}
	manDesc, err := blob(ocispec.MediaTypeImageManifest, man)
	if err != nil {
		return err
	}
	manDesc.Annotations = map[string]string{
		"io.containerd.image.name": img.Name,
		ocispec.AnnotationRefName:  "latest",
	}
	manDesc.Platform = &ocispec.Platform{Architecture: runtime.GOARCH, OS: "linux"}
	idx, err := json.Marshal(ocispec.Index{
		Versioned: specs.Versioned{SchemaVersion: 2}, MediaType: ocispec.MediaTypeImageIndex,
		Manifests: []ocispec.Descriptor{manDesc},
	})
	if err != nil {
		return err
	}
	if err := add(ocispec.ImageLayoutFile, []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := add(ocispec.ImageIndexFile, idx); err != nil {
		return err
	}
	return out.Close()
}
