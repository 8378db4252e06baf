package task

import (
	"encoding/json"
	"fmt"

	"github.com/containerd/errdefs"
	specs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/cube-runtime/cube/shim/sandbox"
)

// withGuestDevices rewrites raw's raw block volumes (sandbox.BlockVolume,
// attached through drive slots) from the host's device numbers to the
// guest's: the linux.devices entry at each volume's container path, and the
// linux.resources.devices rules naming the host's numbers. The agent makes
// the container's node from the entry (its path, file mode, owner kept).
// Other fields pass through as they are.
func withGuestDevices(raw []byte, vols []sandbox.BlockVolume) ([]byte, error) {
	if len(vols) == 0 {
		return raw, nil
	}
	var fields map[string]json.RawMessage
	if err := json.Unmarshal(raw, &fields); err != nil {
		return nil, fmt.Errorf("parse OCI spec: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	var linux map[string]json.RawMessage
	if err := json.Unmarshal(fields["linux"], &linux); err != nil {
		return nil, fmt.Errorf("parse OCI spec linux: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	var devs []specs.LinuxDevice
	if err := json.Unmarshal(linux["devices"], &devs); err != nil {
		return nil, fmt.Errorf("parse OCI spec linux.devices: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	for _, v := range vols {
		found := false
		for i := range devs {
			if devs[i].Type == "b" && devs[i].Path == v.Container {
				devs[i].Major, devs[i].Minor, found = int64(v.GuestMajor), int64(v.GuestMinor), true
			}
		}
		if !found {
			return nil, fmt.Errorf("block volume %s (%s): no linux.devices entry at that path: %w", v.Container, v.Host, errdefs.ErrInvalidArgument)
		}
	}
	var err error
	if linux["devices"], err = json.Marshal(devs); err != nil {
		return nil, err
	}
	if r, ok := linux["resources"]; ok {
		if linux["resources"], err = guestDeviceRules(r, vols); err != nil {
			return nil, err
		}
	}
	if fields["linux"], err = json.Marshal(linux); err != nil {
		return nil, err
	}
	return json.Marshal(fields)
}

// guestDeviceRules rewrites the block device rules of linux.resources
// naming a volume's host numbers to its guest numbers.
func guestDeviceRules(raw json.RawMessage, vols []sandbox.BlockVolume) (json.RawMessage, error) {
	var res map[string]json.RawMessage
	if err := json.Unmarshal(raw, &res); err != nil {
		return nil, fmt.Errorf("parse OCI spec linux.resources: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	d, ok := res["devices"]
	if !ok {
		return raw, nil
	}
	var rules []specs.LinuxDeviceCgroup
	if err := json.Unmarshal(d, &rules); err != nil {
		return nil, fmt.Errorf("parse OCI spec linux.resources.devices: %v: %w", err, errdefs.ErrInvalidArgument)
	}
	for i, r := range rules {
		if r.Type != "b" || r.Major == nil || r.Minor == nil {
			continue
		}
		for _, v := range vols {
			if *r.Major == int64(v.HostMajor) && *r.Minor == int64(v.HostMinor) {
				maj, min := int64(v.GuestMajor), int64(v.GuestMinor)
				rules[i].Major, rules[i].Minor = &maj, &min
			}
		}
	}
	var err error
	if res["devices"], err = json.Marshal(rules); err != nil {
		return nil, err
	}
	return json.Marshal(res)
}
