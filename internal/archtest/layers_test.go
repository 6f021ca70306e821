package archtest

import (
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
)

const module = "github.com/gantry-gpu/gantry/internal/"

// frontEnds are the packages a binary's main (cmd/) or the gantry command's
// table (cli) calls to serve one way in: an engine's runtime, a hook, a
// server, a command. Each stands on the packages below them (inject,
// edits, request, driver, gpu, ...), never on another front end, so that
// one can change without the others. A package's subpackages (doctor's
// gendoc) belong to it. containerhook is not one: besides gantry-cdi-hook's
// commands it holds the hook steps and the OCI state reader that the spec
// writer (cdispec), the pipeline (inject) and hook share, below them all.
var frontEnds = []string{
	"cdicmd",       // gantry cdi generate, cdi list (and nvidia-ctk's)
	"cli",          // the gantry command
	"createserver", // gantry-runtime --create-server
	"deviceplugin", // gantry-device-plugin
	"dockervol",    // nvidia-docker 1.0's volume plugin
	"doctor",       // gantry doctor
	"draplugin",    // gantry-dra-plugin
	"hook",         // gantry-hook, Docker's --gpus prestart hook
	"legacyapi",    // nvidia-docker-plugin's REST API
	"nvcli",        // nvidia-container-cli (LXC)
	"nvdocker",     // the nvidia-docker command
	"shim",         // gantry-runtime, the runc shim
}

// allowed are the only edges between front ends, each with its reason.
var allowed = map[[2]string]string{
	{"cli", "cdicmd"}:          "the gantry command's table runs its cdi subcommands",
	{"cli", "doctor"}:          "the gantry command's table runs gantry doctor",
	{"cli", "dockervol"}:       "the gantry command's table runs the volume plugin",
	{"cli", "legacyapi"}:       "the gantry command's table runs the REST API",
	{"createserver", "shim"}:   "the server makes a create's changes with the shim's own ModifyFor",
	{"createserver", "hook"}:   "the server runs a --gpus hook's Prestart, the hook's own",
	{"legacyapi", "dockervol"}: "its /docker/cli names the volume plugin's driver and volume",
}

// TestFrontEndsImportNoFrontEnd: no front end imports another, but for the
// edges in allowed. The imports are read from every non-test Go file,
// whatever its build tags, so an edge under a tag counts too.
func TestFrontEndsImportNoFrontEnd(t *testing.T) {
	root, err := filepath.Abs("..")
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[2]string]bool{}
	for _, fe := range frontEnds {
		if _, err := os.Stat(filepath.Join(root, fe)); err != nil {
			t.Errorf("front end %s: %v (update frontEnds)", fe, err)
			continue
		}
		for imp, file := range imports(t, filepath.Join(root, fe)) {
			to := frontEndOf(imp)
			if to == "" || to == fe {
				continue
			}
			edge := [2]string{fe, to}
			seen[edge] = true
			if _, ok := allowed[edge]; !ok {
				t.Errorf("front end %s imports front end %s (%s, in %s): move what both need below them, or add the edge to allowed with its reason", fe, to, imp, file)
			}
		}
	}
	var stale []string
	for edge := range allowed {
		if !seen[edge] {
			stale = append(stale, edge[0]+" -> "+edge[1])
		}
	}
	sort.Strings(stale)
	for _, e := range stale {
		t.Errorf("allowed edge %s is not in the tree any more: remove it from allowed", e)
	}
}

// frontEndOf is the front end an import path belongs to, "" for none.
func frontEndOf(imp string) string {
	rest, ok := strings.CutPrefix(imp, module)
	if !ok {
		return ""
	}
	top, _, _ := strings.Cut(rest, "/")
	if slices.Contains(frontEnds, top) {
		return top
	}
	return ""
}

// imports are the imports of the non-test Go files under dir (its
// subpackages too), each with a file that has it.
func imports(t *testing.T, dir string) map[string]string {
	t.Helper()
	out := map[string]string{}
	fset := token.NewFileSet()
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(p, ".go") || strings.HasSuffix(p, "_test.go") {
			return nil
		}
		f, err := parser.ParseFile(fset, p, nil, parser.ImportsOnly)
		if err != nil {
			return err
		}
		for _, s := range f.Imports {
			imp, err := strconv.Unquote(s.Path.Value)
			if err != nil {
				return err
			}
			if _, ok := out[imp]; !ok {
				out[imp] = p
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return out
}
