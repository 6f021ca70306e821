//go:build !cgo || !linux || nonvml

package cudackpt

import "errors"

// load fails: this build cannot load libcuda (gantry-runtime, built
// nonvml and static, runs the
// gantry binary, built with cgo, for the calls).
func load(lib string, restore, pairs bool) (api, bool, error) {
	return nil, false, errors.New("this gantry was built without cgo and cannot load libcuda: use a gantry built with CGO_ENABLED=1 (make build)")
}

func childLoad(lib string) (probeLib, error) {
	_, _, err := load(lib, true, false)
	return nil, err
}

func parentLoad(lib string) (probeLib, bool, error) {
	_, noAPI, err := load(lib, true, true)
	return nil, noAPI, err
}
