package cudackpt

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// probeLib is libcuda as the probe uses it: the checkpoint API, and the
// calls of the probe's own small CUDA process.
type probeLib interface {
	api
	cudaVersion() int
	childGPUs() ([]probeGPU, error)
	childContext(ordinal int) (any, error)
	childCheck(mem any) (uuid string, intact bool, err error)
}

// childMsg is one line the probe's CUDA process prints.
type childMsg struct {
	GPUs   []probeGPU `json:"gpus,omitempty"`
	Ready  bool       `json:"ready,omitempty"`
	UUID   string     `json:"uuid,omitempty"`
	Intact bool       `json:"intact,omitempty"`
	Error  string     `json:"error,omitempty"`
}

// probeChildMain is the probe's CUDA process (gantry cuda-checkpoint
// probe-child): it prints the GPUs CUDA shows it, then on "ctx N" makes a
// context on GPU ordinal N with a buffer of known bytes, and on "check"
// prints the GPU its context is on and whether the bytes are intact.
func probeChildMain(lib string, stdin io.Reader, stdout io.Writer) int {
	enc := json.NewEncoder(stdout)
	fail := func(err error) int {
		enc.Encode(childMsg{Error: err.Error()})
		return 1
	}
	l, err := childLoad(lib)
	if err != nil {
		return fail(err)
	}
	gpus, err := l.childGPUs()
	if err != nil {
		return fail(err)
	}
	enc.Encode(childMsg{GPUs: gpus})
	in := bufio.NewScanner(stdin)
	var mem any
	for in.Scan() {
		f := strings.Fields(in.Text())
		switch {
		case len(f) == 2 && f[0] == "ctx":
			n, _ := strconv.Atoi(f[1])
			if mem, err = l.childContext(n); err != nil {
				return fail(err)
			}
			enc.Encode(childMsg{Ready: true})
		case len(f) == 1 && f[0] == "check" && mem != nil:
			uuid, intact, err := l.childCheck(mem)
			m := childMsg{UUID: uuid, Intact: intact}
			if err != nil {
				m.Error = err.Error()
			}
			enc.Encode(m)
			return 0
		default:
			return fail(fmt.Errorf("unexpected %q", in.Text()))
		}
	}
	return 1
}

// probeRemap runs the probe: a CUDA process of its own (this program as
// probe-child), a context on one GPU, lock and checkpoint, a restore with
// GPU pairs that move it onto another GPU of the same model (every GPU it
// sees is named: those two swapped, the rest onto themselves), unlock, and
// a look at where its context is and whether its memory is intact. A
// failed restore is the verdict (RemapUnsupported, with the driver's
// CUresult), and the process is restored onto its own GPU and ended.
func probeRemap(lib string) (Verdict, error) {
	a, noAPI, err := parentLoad(lib)
	if noAPI {
		return Verdict{Remap: RemapNoAPI, Error: err.Error()}, nil
	}
	if err != nil {
		return Verdict{}, err
	}
	defer a.close()
	v := Verdict{CUDAVersion: a.cudaVersion()}
	args := []string{HelperCommand}
	if lib != "" {
		args = append(args, "--lib", lib)
	}
	cmd := exec.Command("/proc/self/exe", append(args, string(OpProbeChild))...)
	cmd.Env = []string{"PATH=" + helperEnvPath}
	if ld, ok := os.LookupEnv("LD_LIBRARY_PATH"); ok {
		cmd.Env = append(cmd.Env, "LD_LIBRARY_PATH="+ld)
	}
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return v, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return v, err
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return v, fmt.Errorf("starting the probe's CUDA process: %w", err)
	}
	timer := time.AfterFunc(ProbeTimeout, func() { _ = cmd.Process.Kill() })
	defer func() {
		timer.Stop()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	}()
	dec := json.NewDecoder(stdout)
	read := func(what string) (childMsg, error) {
		var m childMsg
		if err := dec.Decode(&m); err != nil {
			return m, fmt.Errorf("the probe's CUDA process (%s): %v %s", what, err, strings.TrimSpace(stderr.String()))
		}
		if m.Error != "" && what != "check" {
			return m, fmt.Errorf("the probe's CUDA process (%s): %s", what, m.Error)
		}
		return m, nil
	}
	m, err := read("its GPUs")
	if err != nil {
		return v, err
	}
	if len(m.GPUs) == 0 {
		return v, errors.New("CUDA shows the probe's process no GPU")
	}
	from, to, pairs := pickProbe(m.GPUs)
	v.From, v.To, v.Model = m.GPUs[from].UUID, m.GPUs[to].UUID, m.GPUs[from].Name
	if _, err := fmt.Fprintf(stdin, "ctx %d\n", from); err != nil {
		return v, err
	}
	if _, err := read("a context"); err != nil {
		return v, err
	}
	pid := cmd.Process.Pid
	if code, name := a.lock(pid, 10000); code != 0 {
		return v, fmt.Errorf("cuCheckpointProcessLock of the probe's process: %s (CUresult %d)", name, code)
	}
	if code, name := a.checkpoint(pid); code != 0 {
		a.unlock(pid)
		return v, fmt.Errorf("cuCheckpointProcessCheckpoint of the probe's process: %s (CUresult %d)", name, code)
	}
	var raw [][2][16]byte
	for _, p := range pairs {
		o, _ := UUIDBytes(p.Old)
		n, _ := UUIDBytes(p.New)
		raw = append(raw, [2][16]byte{o, n})
	}
	if code, name := a.restore(pid, raw); code != 0 {
		v.Remap, v.Error, v.Code = RemapUnsupported, "cuCheckpointProcessRestore with GPU pairs: "+name, code
		a.restore(pid, nil)
		a.unlock(pid)
		return v, nil
	}
	if code, name := a.unlock(pid); code != 0 {
		v.Remap, v.Error, v.Code = RemapUnsupported, "cuCheckpointProcessUnlock after the restore: "+name, code
		return v, nil
	}
	if _, err := io.WriteString(stdin, "check\n"); err != nil {
		return v, err
	}
	m, err = read("check")
	switch {
	case err != nil:
		return v, err
	case m.Error != "":
		v.Remap, v.Error = RemapUnsupported, "the restored process: "+m.Error
	case m.UUID != v.To:
		v.Remap, v.Error = RemapUnsupported, fmt.Sprintf("the restored process's context is on %s, not %s", m.UUID, v.To)
	case !m.Intact:
		v.Remap, v.Error = RemapUnsupported, "the restored process's GPU memory changed"
	case from == to:
		v.Remap = RemapIdentityOnly
	default:
		v.Remap = RemapSupported
	}
	return v, nil
}
