package draplugin

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// checkpointVersion is the format of the checkpoint file; a file of
// another version is refused rather than misread.
const checkpointVersion = 1

// checkpoint is what the plugin knows about prepared claims, kept on disk
// so that it survives plugin and kubelet restarts: UnprepareResourceClaims
// gets only a claim's UID and name, and the claim may be gone by then.
type checkpoint struct {
	Version int                      `json:"version"`
	Driver  string                   `json:"driver"`
	Claims  map[string]preparedClaim `json:"claims"`
}

// preparedClaim is one prepared claim: where its CDI spec is and the
// devices answered to the kubelet.
type preparedClaim struct {
	Namespace string           `json:"namespace"`
	Name      string           `json:"name"`
	Spec      string           `json:"spec"`
	Devices   []preparedDevice `json:"devices"`
	// Sharing is what prepare applied to the devices (sharing.go).
	Sharing []preparedSharing `json:"sharing,omitempty"`
	// Pods are the pods the claim is reserved for, as the kubelet's
	// prepares saw them (pods.go): the runtime reads them (package
	// gpuholders) to refuse the claim's GPUs to other pods.
	Pods []preparedPod `json:"pods,omitempty"`
}

type preparedDevice struct {
	Requests     []string `json:"requests,omitempty"`
	Pool         string   `json:"pool"`
	Device       string   `json:"device"`
	UUID         string   `json:"uuid"`
	AdminAccess  bool     `json:"adminAccess,omitempty"`
	CDIDeviceIDs []string `json:"cdiDeviceIDs"`
}

// readCheckpoint loads path; a missing file is an empty checkpoint.
func readCheckpoint(path, driverName string) (*checkpoint, error) {
	cp := &checkpoint{Version: checkpointVersion, Driver: driverName, Claims: map[string]preparedClaim{}}
	data, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return cp, nil
	}
	if err != nil {
		return nil, fmt.Errorf("reading checkpoint %s: %w", path, err)
	}
	if err := json.Unmarshal(data, cp); err != nil {
		return nil, fmt.Errorf("checkpoint %s is not valid JSON (%w): fix or remove it, after removing the CDI specs of the claims it prepared", path, err)
	}
	if cp.Version != checkpointVersion {
		return nil, fmt.Errorf("checkpoint %s has version %d, this plugin reads version %d: use the plugin that wrote it to unprepare its claims", path, cp.Version, checkpointVersion)
	}
	if cp.Driver != driverName {
		return nil, fmt.Errorf("checkpoint %s belongs to driver %q, not %q: give each driver its own --plugin-dir", path, cp.Driver, driverName)
	}
	if cp.Claims == nil {
		cp.Claims = map[string]preparedClaim{}
	}
	return cp, nil
}

// write stores cp atomically: a crash leaves the old checkpoint or the new
// one, never a torn file.
func (cp *checkpoint) write(path string) error {
	data, err := json.MarshalIndent(cp, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding checkpoint: %w", err)
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return fmt.Errorf("writing checkpoint %s: %w", path, err)
	}
	if err := atomicfile.Write(path, append(data, '\n'), atomicfile.Options{Mode: 0o600, Sync: true}); err != nil {
		return fmt.Errorf("writing checkpoint %s: %w", path, err)
	}
	return nil
}
