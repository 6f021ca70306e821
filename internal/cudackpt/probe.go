package cudackpt

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
)

// Remap verdicts of the probe (Verdict.Remap).
const (
	// RemapSupported: a CUDA process checkpointed on one GPU was restored
	// onto another of the same model, its memory intact.
	RemapSupported = "supported"
	// RemapIdentityOnly: the host has no two GPUs of one model; restore
	// with GPU pairs (each GPU onto itself) works, a move is untested.
	RemapIdentityOnly = "identity-only"
	// RemapUnsupported: the driver refused or failed the restore onto
	// another GPU (Verdict.Error says how).
	RemapUnsupported = "unsupported"
	// RemapNoAPI: the driver has no checkpoint API or no GPU pairs (< r580).
	RemapNoAPI = "no-api"
)

// Verdict is what the probe found of the driver's restore onto other GPUs.
type Verdict struct {
	DriverVersion string `json:"driverVersion"`
	// CUDAVersion is cuDriverGetVersion's (13000 for r580).
	CUDAVersion int    `json:"cudaVersion,omitempty"`
	Remap       string `json:"remap"`
	// From and To are the GPUs probed (the same one for identity-only);
	// Model their model.
	From  string `json:"from,omitempty"`
	To    string `json:"to,omitempty"`
	Model string `json:"model,omitempty"`
	// Error and Code are the failed call's CUresult name and number, or
	// what else went wrong.
	Error string `json:"error,omitempty"`
	Code  int    `json:"code,omitempty"`
	// At is when the probe ran (RFC 3339).
	At string `json:"at"`
}

// Allows reports whether a restore onto other GPUs may go ahead.
func (v Verdict) Allows() bool { return v.Remap == RemapSupported || v.Remap == RemapIdentityOnly }

// String is the verdict in words.
func (v Verdict) String() string {
	switch v.Remap {
	case RemapSupported:
		return fmt.Sprintf("NVIDIA driver %s restores a CUDA process onto another GPU of the same model (probed %s -> %s, %s, at %s)", v.DriverVersion, v.From, v.To, v.Model, v.At)
	case RemapIdentityOnly:
		return fmt.Sprintf("NVIDIA driver %s restores with GPU pairs (probed %s onto itself at %s; this host has no two GPUs of one model to probe a move)", v.DriverVersion, v.From, v.At)
	case RemapNoAPI:
		return fmt.Sprintf("NVIDIA driver %s cannot restore onto other GPUs: %s", v.DriverVersion, v.Error)
	}
	return fmt.Sprintf("NVIDIA driver %s cannot restore a CUDA process onto another GPU: probed %s -> %s (%s) at %s: %s", v.DriverVersion, v.From, v.To, v.Model, v.At, v.Error)
}

// CacheFile is where the verdict for driverVersion is kept in dir
// (runtime.cache-dir, /run/gantry): one file per driver version, so a
// driver update probes again.
func CacheFile(dir, driverVersion string) string {
	safe := strings.Map(func(r rune) rune {
		if r >= '0' && r <= '9' || r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r == '.' || r == '-' || r == '_' {
			return r
		}
		return '_'
	}, driverVersion)
	return filepath.Join(dir, "cuda-remap-"+safe+".json")
}

// ReadCache reads the cached verdict for driverVersion: found is false when
// there is none. The file is opened without following a link or waiting on
// a FIFO, and must be a regular file of root's that no one else may write
// (a restore trusts it).
func ReadCache(dir, driverVersion string) (v Verdict, found bool, err error) {
	p := CacheFile(dir, driverVersion)
	fd, err := unix.Open(p, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC, 0)
	if errors.Is(err, unix.ENOENT) {
		return v, false, nil
	}
	if err != nil {
		return v, false, fmt.Errorf("opening %s: %w", p, err)
	}
	f := os.NewFile(uintptr(fd), p)
	defer f.Close()
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		return v, false, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || st.Uid != 0 || st.Mode&0o022 != 0 {
		return v, false, fmt.Errorf("%s is not a regular file of root's that only root may write: remove it (the next restore onto other GPUs probes again)", p)
	}
	b, err := io.ReadAll(io.LimitReader(f, 64<<10))
	if err != nil {
		return v, false, err
	}
	if err := json.Unmarshal(b, &v); err != nil || v.DriverVersion != driverVersion || v.Remap == "" {
		return v, false, fmt.Errorf("%s: not a probe verdict for driver %s: remove it", p, driverVersion)
	}
	return v, true, nil
}

// WriteCache keeps v (mode 0644, written atomically).
func WriteCache(dir string, v Verdict) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return atomicfile.Write(CacheFile(dir, v.DriverVersion), append(b, '\n'), atomicfile.Options{Mode: 0o644})
}

// ProbeRequest is one probe through the helper.
type ProbeRequest struct {
	// Lib is libcuda (empty: libcuda.so.1 by the loader's rules).
	Lib string
	// CacheDir keeps the verdict per driver version (empty: not kept).
	CacheDir      string
	DriverVersion string
	// Fresh probes even when a verdict is cached.
	Fresh bool
}

// Probe returns the verdict on restoring onto other GPUs for the driver:
// the cached one, else the helper's (gantry cuda-checkpoint probe, which
// runs a small CUDA process of its own, checkpoints it on one GPU and
// restores it onto another of the same model, and caches the verdict).
// cached reports a verdict read from the cache.
func Probe(gantry string, req ProbeRequest) (v Verdict, cached bool, err error) {
	if req.CacheDir != "" && !req.Fresh {
		v, found, err := ReadCache(req.CacheDir, req.DriverVersion)
		if err != nil {
			return v, false, err
		}
		if found {
			return v, true, nil
		}
	}
	args := []string{HelperCommand}
	if req.Lib != "" {
		args = append(args, "--lib", req.Lib)
	}
	if req.CacheDir != "" {
		args = append(args, "--cache-dir", req.CacheDir)
	}
	if req.Fresh {
		args = append(args, "--fresh")
	}
	args = append(args, "--driver-version", req.DriverVersion, string(OpProbe))
	cmd := exec.Command(gantry, args...)
	cmd.Env = []string{"PATH=" + helperEnvPath}
	if v, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+v)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Start(); err != nil {
		return v, false, fmt.Errorf("running %s %s probe: %w", gantry, HelperCommand, err)
	}
	timer := time.AfterFunc(ProbeTimeout+30*time.Second, func() { _ = cmd.Process.Kill() })
	werr := cmd.Wait()
	timer.Stop()
	var r Reply
	if err := json.Unmarshal(stdout.Bytes(), &r); err != nil || (r.Probe == nil && r.Error == "") {
		why := strings.TrimSpace(stderr.String())
		if why == "" && werr != nil {
			why = werr.Error()
		}
		return v, false, fmt.Errorf("%s %s probe gave no answer: %s", gantry, HelperCommand, why)
	}
	if r.Probe == nil {
		return v, false, errors.New(r.Error)
	}
	return *r.Probe, false, nil
}

// ProbeTimeout bounds the probe's CUDA process (its start, cuInit on every
// GPU, one small checkpoint and restore).
const ProbeTimeout = 2 * time.Minute

// probeMain is the helper's probe: the cached verdict unless fresh, else a
// probe, cached when it could run.
func probeMain(lib, cacheDir, driverVersion string, fresh bool) Reply {
	if cacheDir != "" && !fresh {
		if v, found, err := ReadCache(cacheDir, driverVersion); err != nil {
			return Reply{Error: err.Error()}
		} else if found {
			return Reply{Probe: &v}
		}
	}
	v, err := probeRemap(lib)
	if err != nil {
		return Reply{Error: "probing the driver's restore onto other GPUs: " + err.Error()}
	}
	v.DriverVersion = driverVersion
	v.At = time.Now().UTC().Format(time.RFC3339)
	if cacheDir != "" {
		if err := WriteCache(cacheDir, v); err != nil {
			return Reply{Probe: &v, Error: "keeping the verdict: " + err.Error()}
		}
	}
	return Reply{Probe: &v}
}

// probeGPU is one GPU as the probe's CUDA process sees it.
type probeGPU struct {
	UUID string `json:"uuid"`
	Name string `json:"name"`
}

// pickProbe chooses the probe's GPUs: the first GPU and another of its
// model (identity when there is none), and the pairs over every GPU the
// process sees (the driver wants every GPU visible to CUDA named): the
// two swapped, each other onto itself.
func pickProbe(gpus []probeGPU) (from, to int, pairs []Pair) {
	to = 0
	for i := 1; i < len(gpus); i++ {
		if gpus[i].Name == gpus[0].Name {
			to = i
			break
		}
	}
	for i, g := range gpus {
		n := g.UUID
		switch i {
		case 0:
			n = gpus[to].UUID
		case to:
			n = gpus[0].UUID
		}
		pairs = append(pairs, Pair{Old: g.UUID, New: n})
	}
	return 0, to, pairs
}
