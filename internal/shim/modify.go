package shim

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	ocispecs "github.com/opencontainers/runtime-spec/specs-go"

	"github.com/gantry-gpu/gantry/internal/atomicfile"
	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/inject"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
	"github.com/gantry-gpu/gantry/internal/rootfs"
)

// Modify decides what the container in bundle asks for and, if anything,
// applies it (package inject): SONAME links and ld.so.cache entries inside
// the root filesystem (through root-confined paths, before runc mounts
// anything, so the loader in the container finds libcuda.so.1 by its normal
// rules), then device nodes, cgroup rules, mounts and env in config.json,
// rewritten atomically. A container that asks for nothing is not touched at
// all.
//
// The record (never nil) says what was done, for the log line. Any error
// leaves config.json as it was: the caller must then not start the
// container.
func Modify(bundle string, cfg config.Config) (*inject.Record, error) {
	rec := inject.NewRecord(inject.FrontEndRuntime, "", bundle)
	return rec, ModifyFor(rec, bundle, cfg, "")
}

// ModifyFor is Modify recording into rec; an absolute root.path is taken
// below rootDir when set (the create server's caller's root,
// /proc/PID/root, package createserver), else as it is.
func ModifyFor(rec *inject.Record, bundle string, cfg config.Config, rootDir string) error {
	// One modify of a bundle at a time: the create server's and the
	// in-process one after the constructor gave up waiting for it (or a
	// retried create). The second one then finds the first one's work
	// (inject.Already) and leaves it.
	_, unlock, err := ocibundle.Lock(bundle, ocibundle.LockWait)
	if err != nil {
		return err
	}
	defer unlock()
	specPath := ocibundle.SpecPath(bundle)
	raw, err := ocibundle.ReadSpec(bundle)
	if err != nil {
		return err
	}
	// The request needs four fields; decoding only them keeps the common
	// case, a container without GPUs, cheap.
	var peek inject.SpecFields
	if err := json.Unmarshal(raw, &peek); err != nil {
		return fmt.Errorf("%s: not an OCI runtime spec: %w", specPath, err)
	}
	if v, done := inject.Already(peek.Annotations); done {
		// Injected already (a retried create of the same bundle, or a
		// runtime chain with Gantry twice in it).
		rec.Notes = append(rec.Notes, inject.AlreadyNote(v))
		return nil
	}
	req, err := inject.ReadRequest(peek.Spec(), cfg, rec)
	if err != nil {
		return err
	}
	rec.Phase("request")
	if !req.Wants() {
		return nil
	}

	// The top level is checked to be a JSON object before anything is
	// changed; the edits then go into the fields they touch (patchSpec), or
	// through the whole spec when they cannot (fullSpec).
	top, err := decodeObject(raw)
	if err != nil {
		return fmt.Errorf("%s: not an OCI runtime spec: %w", specPath, err)
	}
	plan, err := inject.Prepare(cfg, req, inject.Options{CDI: true, ForwardCompat: true, SpecMounts: inject.MountPaths(peek.Spec())}, rec)
	if err != nil {
		return err
	}
	// config.json's new content is made and written beside it while the
	// root filesystem is changed (they share no file), and put in place
	// only once that succeeded: a failed create leaves config.json as it
	// was.
	type specResult struct {
		staged *atomicfile.Staged
		err    error
	}
	staged := make(chan specResult, 1)
	go func() {
		out, err := patchSpec(top, plan)
		if errors.Is(err, errNoPatch) {
			out, err = fullSpec(raw, plan)
		}
		if err != nil {
			staged <- specResult{err: fmt.Errorf("%s: %w", specPath, err)}
			return
		}
		mode := os.FileMode(0o644)
		if st, err := os.Stat(specPath); err == nil {
			mode = st.Mode().Perm()
		}
		// No fsync: the bundle is rewritten on every create, in the hot path.
		s, err := atomicfile.Stage(specPath, out, mode)
		if err != nil {
			err = fmt.Errorf("writing %s: %w", specPath, err)
		}
		staged <- specResult{s, err}
	}()
	err = plan.FinishRootfs(func() (*rootfs.Root, error) {
		rootPath := peek.RootPath()
		if rootPath == "" {
			return nil, errors.New("config.json has no root.path: cannot add the driver libraries to the container's loader cache")
		}
		if !filepath.IsAbs(rootPath) {
			rootPath = filepath.Join(bundle, rootPath)
		} else if rootDir != "" {
			rootPath = filepath.Join(rootDir, rootPath)
		}
		root, err := rootfs.Open(rootPath)
		if err != nil {
			return nil, fmt.Errorf("opening the container's root filesystem: %w", err)
		}
		// runc mounts over the rootfs next: no fsync in the hot path.
		root.SkipSync()
		return root, nil
	}, nil)
	spec := <-staged
	if err != nil {
		if spec.staged != nil {
			spec.staged.Abort()
		}
		return err
	}
	rec.Phase("rootfs")
	if spec.err != nil {
		return spec.err
	}
	if err := spec.staged.Commit(); err != nil {
		return fmt.Errorf("writing %s: %w", specPath, err)
	}
	rec.Phase("spec")
	return nil
}

// fullSpec applies plan to the whole spec in raw. A spec with fields this
// build does not know (a newer runtime-spec) is merged back field by field,
// so nothing of it is lost; the usual spec is simply re-encoded.
func fullSpec(raw []byte, plan *inject.Plan) ([]byte, error) {
	var spec ocispecs.Spec
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	known := dec.Decode(&spec) == nil
	if !known {
		spec = ocispecs.Spec{}
		if err := json.Unmarshal(raw, &spec); err != nil {
			return nil, fmt.Errorf("not an OCI runtime spec: %w", err)
		}
	}
	if err := plan.ApplyToSpec(&spec); err != nil {
		return nil, err
	}
	if known {
		return json.Marshal(&spec)
	}
	return mergeJSON(raw, &spec)
}

// mergeJSON serialises spec over the original config.json so that fields
// this build's runtime-spec types do not know (a newer spec version's) are
// kept: objects are merged key by key, spec's values winning.
func mergeJSON(orig []byte, spec *ocispecs.Spec) ([]byte, error) {
	typed, err := json.Marshal(spec)
	if err != nil {
		return nil, err
	}
	// Numbers stay json.Number: uids, device numbers and memory limits do
	// not survive a trip through float64.
	o, err := decodeNumbers(orig)
	if err != nil {
		return nil, err
	}
	t, err := decodeNumbers(typed)
	if err != nil {
		return nil, err
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(merge(o, t)); err != nil {
		return nil, err
	}
	return bytes.TrimRight(buf.Bytes(), "\n"), nil
}

func decodeNumbers(b []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	err := dec.Decode(&v)
	return v, err
}

func merge(orig, typed any) any {
	om, ok1 := orig.(map[string]any)
	tm, ok2 := typed.(map[string]any)
	if !ok1 || !ok2 {
		return typed
	}
	for k, v := range tm {
		om[k] = merge(om[k], v)
	}
	return om
}
