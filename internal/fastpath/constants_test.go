//go:build cgo

package fastpath_test

import (
	"path"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/config"
	"github.com/gantry-gpu/gantry/internal/createproto"
	"github.com/gantry-gpu/gantry/internal/discover"
	"github.com/gantry-gpu/gantry/internal/fastpath"
	"github.com/gantry-gpu/gantry/internal/hook"
	"github.com/gantry-gpu/gantry/internal/ocibundle"
	"github.com/gantry-gpu/gantry/internal/request"
	"github.com/gantry-gpu/gantry/internal/shim"
)

// widening are the configuration keys that can make a container ask for a
// GPU that it would not ask for under the defaults: with any of them in
// the file, the C fast path sends every create to Go.
var widening = []string{"cdi.annotation-prefixes", "runtime.swarm-resource"}

// TestConstants pins every constant fastpath.c copies from Go.
func TestConstants(t *testing.T) {
	c := fastpath.CConstants()
	needles := []string{request.EnvVisibleDevices, request.EnvCUDAVersion, path.Base(request.VolumeMountsRoot), request.DefaultAnnotationPrefix, `\`}
	if !slices.Equal(c.RequestNeedles, needles) {
		t.Errorf("fastpath.c request needles %q, want %q (the text a request is read from, as package request names it)", c.RequestNeedles, needles)
	}
	for _, p := range request.DefaultOptions().AnnotationPrefixes {
		if !slices.Contains(c.RequestNeedles, p) {
			t.Errorf("default annotation prefix %q is not a needle of fastpath.c", p)
		}
	}
	for name, pair := range map[string][2]string{
		"GANTRY_CONFIG":   {c.ConfigEnv, config.EnvPath},
		"default config":  {c.ConfigDefault, config.DefaultPath},
		"default PATH":    {c.DefaultPath, shim.DefaultPath},
		"no-fastpath env": {c.NoFastPathEnv, "GANTRY_NO_FASTPATH"},
		"server protocol": {c.ServerMagic, createproto.ServerProtocol},
		"server socket":   {c.ServerSocket, createproto.DefaultServerSocket},
		"server env":      {c.ServerSocketEnv, createproto.ServerSocketEnv},
		"server flag":     {c.ServerFlag, createproto.ServerFlag},
		"hook protocol":   {c.HookMagic, createproto.HookProtocol},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s: fastpath.c has %q, Go %q", name, pair[0], pair[1])
		}
	}
	if c.MaxSpecSize != ocibundle.MaxSpecSize {
		t.Errorf("fastpath.c reads config.json up to %d bytes, ocibundle.MaxSpecSize is %d", c.MaxSpecSize, ocibundle.MaxSpecSize)
	}
	if c.MaxHookState != createproto.MaxHookState {
		t.Errorf("fastpath.c sends a hook's state up to %d bytes, createproto.MaxHookState is %d", c.MaxHookState, createproto.MaxHookState)
	}
	if c.MaxStateSize != ocibundle.MaxStateSize {
		t.Errorf("fastpath.c gives a hook's Go code %d bytes of state at most, ocibundle.MaxStateSize is %d", c.MaxStateSize, ocibundle.MaxStateSize)
	}
	for name, pair := range map[string][2]int64{
		"server connect timeout": {c.ServerConnectMS, createproto.ServerConnectTimeout.Milliseconds()},
		"server ack timeout":     {c.ServerAckMS, createproto.ServerAckTimeout.Milliseconds()},
		"server answer timeout":  {c.ServerAnswerMS, createproto.ServerAnswerTimeout.Milliseconds()},
		"server accepted byte":   {int64(c.ServerAccepted), int64(createproto.ServerAccepted)},
	} {
		if pair[0] != pair[1] {
			t.Errorf("%s: fastpath.c has %d, Go %d", name, pair[0], pair[1])
		}
	}
	if want := []string{"gantry-runtime", "nvidia-container-runtime"}; !slices.Equal(c.RuntimeNames, want) {
		t.Errorf("runtime names %q, want %q", c.RuntimeNames, want)
	}
	if want := []string{"nvidia-ctk"}; !slices.Equal(c.CTKNames, want) {
		t.Errorf("nvidia-ctk names %q, want %q", c.CTKNames, want)
	}
	if !slices.Equal(c.HookNames, hook.Names) {
		t.Errorf("hook names %q, want hook.Names %q", c.HookNames, hook.Names)
	}

	// Every configuration key is either neutral (in fastpath.c's list) or
	// widening, never both; a new key fails here until classified.
	keys := configKeys(reflect.TypeOf(config.Config{}), "")
	for _, k := range keys {
		n, w := slices.Contains(c.NeutralKeys, k), slices.Contains(widening, k)
		if n == w {
			t.Errorf("configuration key %s: neutral (fastpath.c) %v, widening %v: classify it as exactly one", k, n, w)
		}
	}
	for _, k := range append(slices.Clone(c.NeutralKeys), widening...) {
		if !slices.Contains(keys, k) {
			t.Errorf("%s is not a configuration key (keys: %s)", k, strings.Join(keys, ", "))
		}
	}
	// And the classification matches what the request options read: a
	// neutral key set to anything leaves the annotation prefixes and the
	// swarm variables at their defaults; a widening one changes them.
	def := discover.RequestOptions(config.Default())
	for _, k := range keys {
		cfg := config.Default()
		setKey(t, reflect.ValueOf(&cfg).Elem(), strings.Split(k, "."))
		opts := discover.RequestOptions(cfg)
		widens := !slices.Equal(opts.AnnotationPrefixes, def.AnnotationPrefixes) || len(opts.SwarmResource) > 0
		if widens != slices.Contains(widening, k) {
			t.Errorf("configuration key %s: changes the request sources = %v, but classified widening = %v", k, widens, !widens)
		}
	}
}

// configKeys lists the dotted TOML keys of t.
func configKeys(t reflect.Type, prefix string) []string {
	var out []string
	for i := range t.NumField() {
		f := t.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("toml"), ",")
		if name == "" || name == "-" {
			continue
		}
		if f.Type.Kind() == reflect.Struct {
			out = append(out, configKeys(f.Type, prefix+name+".")...)
			continue
		}
		out = append(out, prefix+name)
	}
	return out
}

// setKey sets the key at path in v to a non-default value.
func setKey(t *testing.T, v reflect.Value, path []string) {
	for i := range v.NumField() {
		name, _, _ := strings.Cut(v.Type().Field(i).Tag.Get("toml"), ",")
		if name != path[0] {
			continue
		}
		f := v.Field(i)
		if len(path) > 1 {
			setKey(t, f, path[1:])
			return
		}
		switch f.Kind() {
		case reflect.String:
			f.SetString("example.com/x")
		case reflect.Bool:
			f.SetBool(!f.Bool())
		case reflect.Slice:
			f.Set(reflect.ValueOf([]string{"example.com/x"}))
		default:
			t.Fatalf("configuration key %s has a type (%s) this test does not set", strings.Join(path, "."), f.Kind())
		}
		return
	}
	t.Fatalf("no field for %s", strings.Join(path, "."))
}

// TestParseConfig: the C reader of the configuration file.
func TestParseConfig(t *testing.T) {
	for _, tc := range []struct {
		name, text, low string
		ok, create      bool
	}{
		{"empty", "", "runc", true, true},
		{"bench's file", "gpus = \"sim:h100x8\"\ndriver-root = \"/tmp/d\"\n\n[runtime]\nlow-level = \"/bin/true\"\ncache-dir = \"/tmp/c\"\nlog-file = \"/tmp/l\"\n", "/bin/true", true, true},
		{"dotted, comments, booleans, arrays", "# c\nruntime.low-level = 'crun' # x\nruntime.accept-volume-mounts = true\n[cdi]\nspec-dirs = [\"/etc/cdi\", '/var/run/cdi']\n", "crun", true, true},
		{"annotation prefixes", "[cdi]\nannotation-prefixes = [\"x/\"]\n", "runc", true, false},
		{"swarm", "runtime.swarm-resource = [\"DOCKER_RESOURCE_GPU\"]\n", "runc", true, false},
		{"inline table", "cdi = { annotation-prefixes = [\"x/\"] }\n", "runc", true, false},
		{"quoted key", "[cdi]\n\"annotation-prefixes\" = [\"x/\"]\n", "runc", true, false},
		{"escaped quoted key", "[cdi]\n\"annotation\\u002dprefixes\" = [\"x/\"]\n", "runc", true, false},
		{"unknown key", "[runtime]\nfuture-key = \"x\"\n", "runc", true, false},
		{"unknown table", "[future]\nlow-level2 = 1\n", "", false, false},
		{"array of tables", "[[cdi]]\nkind = \"a/b\"\n", "runc", true, false},
		{"escape in a value", "gpus = \"sim:\\u0068100x8\"\n", "runc", true, false},
		{"multi-line string", "gpus = \"\"\"\nnvml\"\"\"\n", "", false, false},
		{"low-level inside a multi-line string", "[runtime]\nlog-file = '''\nlow-level = \"/bin/evil\"\na = '''\n", "", false, false},
		{"number", "log-level = 3\n", "runc", true, false},
		{"multi-line array", "[cdi]\nspec-dirs = [\n\"/etc/cdi\",\n]\n", "", false, false},
		{"low-level with escape", "[runtime]\nlow-level = \"\\u0072unc\"\n", "", false, false},
		{"low-level elsewhere", "[cdi]\nlow-level = \"x\"\n", "", false, false},
		{"runtime inline table", "runtime = { low-level = \"x\" }\n", "", false, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			low, ok, create := fastpath.ParseConfig([]byte(tc.text))
			if ok != tc.ok || create != tc.create || (ok && low != tc.low) {
				t.Errorf("ParseConfig(%q) = %q, %v, %v; want %q, %v, %v", tc.text, low, ok, create, tc.low, tc.ok, tc.create)
			}
			// Whatever C accepts for a create, Go must read as a file
			// whose request options are the defaults'.
			if create {
				cfg, err := config.Parse([]byte(tc.text))
				if err != nil {
					return // Go refuses the file: the engine's next call fails; no request is missed
				}
				if o, d := discover.RequestOptions(cfg), discover.RequestOptions(config.Default()); !slices.Equal(o.AnnotationPrefixes, d.AnnotationPrefixes) || len(o.SwarmResource) > 0 {
					t.Errorf("C lets creates skip Go under %q, whose request options widen: %+v", tc.text, o)
				}
			}
		})
	}
}
