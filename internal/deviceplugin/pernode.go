package deviceplugin

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/internal/kubeapi"
)

// Per-node configurations, as NVIDIA's chart offers them with its
// config-manager sidecar, built into the plugin: a directory of named
// configuration files (a ConfigMap with several keys, mounted), one picked
// per node by the node label nvidia.com/device-plugin.config, else a
// default; the plugin restarts itself with the new file when the label or
// the chosen file's content changes. The settings are the config-manager's
// environment variables:
//
//	CONFIG_FILE_SRCDIR   the directory of named configs (turns the mode on)
//	DEFAULT_CONFIG       the name used when the label is unset or names no config
//	NODE_LABEL           the label (default nvidia.com/device-plugin.config)
//	FALLBACK_STRATEGIES  without DEFAULT_CONFIG: named (a config named
//	                     "default"), single (the only config), empty (no
//	                     file: the defaults), tried in order (default named,single)
//	NODE_NAME            this node; KUBECONFIG or the service account reach the API
//
// A label naming no config keeps the default and is reported, naming the
// valid names, in the log and as a Warning Event on the Node.
const (
	// DefaultConfigLabel is the node label that names a node's config.
	DefaultConfigLabel = "nvidia.com/device-plugin.config"
	// fallbackDefaultName is the config the "named" fallback looks for.
	fallbackDefaultName = "default"
)

// configLabelPoll is how often the node label and the chosen file are
// looked at (a variable for tests).
var configLabelPoll = 10 * time.Second

// perNode chooses a node's configuration.
type perNode struct {
	dir, label, def, node string
	fallbacks             []string
	client                *kubeapi.Client // nil: no API server, the default only
	log                   *slog.Logger
	reported              map[string]bool // bad label values already reported
}

// perNodeFromEnv reads the settings; nil when CONFIG_FILE_SRCDIR is unset.
func perNodeFromEnv(getenv func(string) string, log *slog.Logger) (*perNode, error) {
	dir := getenv("CONFIG_FILE_SRCDIR")
	if dir == "" {
		return nil, nil
	}
	pn := &perNode{dir: dir, label: getenv("NODE_LABEL"), def: getenv("DEFAULT_CONFIG"), node: getenv("NODE_NAME"),
		log: log, reported: map[string]bool{}}
	if pn.label == "" {
		pn.label = DefaultConfigLabel
	}
	fb := getenv("FALLBACK_STRATEGIES")
	if fb == "" {
		fb = "named,single"
	}
	for s := range strings.SplitSeq(fb, ",") {
		switch s = strings.TrimSpace(s); s {
		case "named", "single", "empty":
			pn.fallbacks = append(pn.fallbacks, s)
		case "":
		default:
			return nil, fmt.Errorf("%w: FALLBACK_STRATEGIES=%s: unknown strategy %q; allowed (a comma list, in order): named, single, empty", ErrConfig, fb, s)
		}
	}
	if pn.node == "" {
		log.Warn("CONFIG_FILE_SRCDIR is set but NODE_NAME is not: the node label cannot be read, the default config is used",
			"label", pn.label)
		return pn, nil
	}
	c, err := kubeapi.FromEnv(getenv)
	if err != nil {
		return nil, fmt.Errorf("CONFIG_FILE_SRCDIR: reading the node label %s needs the API server: %w", pn.label, err)
	}
	pn.client = c
	return pn, nil
}

// names are the configs in the directory: its files, without the
// ..-prefixed entries a mounted ConfigMap has.
func (pn *perNode) names() ([]string, error) {
	ents, err := os.ReadDir(pn.dir)
	if err != nil {
		return nil, fmt.Errorf("%w: CONFIG_FILE_SRCDIR=%s: %v", ErrConfig, pn.dir, err)
	}
	var out []string
	for _, e := range ents {
		if strings.HasPrefix(e.Name(), "..") {
			continue
		}
		if fi, err := os.Stat(filepath.Join(pn.dir, e.Name())); err == nil && fi.Mode().IsRegular() {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// labelValue is the node's label ("" when unset or unreadable).
func (pn *perNode) labelValue(ctx context.Context) string {
	if pn.client == nil {
		return ""
	}
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	n, err := pn.client.GetNode(ctx, pn.node)
	if err != nil {
		pn.log.Warn("reading the node's config label", "node", pn.node, "label", pn.label, "err", err)
		return ""
	}
	return n.Metadata.Labels[pn.label]
}

// choose picks the config for the label's value: that name if it is one,
// else the default (DEFAULT_CONFIG, then the fallbacks). ok is false when
// value is set but names no config (bad says why). "" with a nil error is
// the empty fallback: no file.
func (pn *perNode) choose(value string) (name, bad string, err error) {
	names, err := pn.names()
	if err != nil {
		return "", "", err
	}
	if len(names) == 0 {
		return "", "", fmt.Errorf("%w: CONFIG_FILE_SRCDIR=%s holds no config file", ErrConfig, pn.dir)
	}
	if value != "" {
		if slices.Contains(names, value) {
			return value, "", nil
		}
		bad = fmt.Sprintf("node label %s=%s names no config in %s; valid names: %s; using the default", pn.label, value, pn.dir, strings.Join(names, ", "))
	}
	if pn.def != "" {
		if !slices.Contains(names, pn.def) {
			return "", bad, fmt.Errorf("%w: DEFAULT_CONFIG=%s is not a config in %s; valid names: %s", ErrConfig, pn.def, pn.dir, strings.Join(names, ", "))
		}
		return pn.def, bad, nil
	}
	for _, f := range pn.fallbacks {
		switch {
		case f == "named" && slices.Contains(names, fallbackDefaultName):
			return fallbackDefaultName, bad, nil
		case f == "single" && len(names) == 1:
			return names[0], bad, nil
		case f == "empty":
			return "", bad, nil
		}
	}
	return "", bad, fmt.Errorf("%w: no config for this node: the label %s is unset, DEFAULT_CONFIG is unset, and the fallbacks (%s) found none among %s; set DEFAULT_CONFIG or label the node",
		ErrConfig, pn.label, strings.Join(pn.fallbacks, ","), strings.Join(names, ", "))
}

// current is the chosen name and its file's content now, with a bad label
// reported once per value.
func (pn *perNode) current(ctx context.Context) (name string, content []byte, err error) {
	value := pn.labelValue(ctx)
	name, bad, err := pn.choose(value)
	if bad != "" && !pn.reported[value] {
		pn.reported[value] = true
		pn.log.Warn(bad)
		if pn.client != nil {
			postNodeEvent(pn.client, pn.node, "Warning", "ConfigLabelInvalid", bad, pn.log)
		}
	}
	if err != nil || name == "" {
		return name, nil, err
	}
	content, err = os.ReadFile(filepath.Join(pn.dir, name))
	return name, content, err
}

// runPerNode runs the plugin (run, with --config set to the chosen file)
// and runs it again with the new choice whenever the label or the chosen
// file's content changes, until ctx ends.
func runPerNode(ctx context.Context, pn *perNode, args []string, getenv func(string) string, stdout, stderr io.Writer) int {
	// The plugin run below must not choose again.
	childEnv := func(k string) string {
		if k == "CONFIG_FILE_SRCDIR" || k == "CONFIG_FILE" {
			return ""
		}
		return getenv(k)
	}
	for {
		name, content, err := pn.current(ctx)
		if err != nil {
			fmt.Fprintf(stderr, "gantry-device-plugin: %v\n", err)
			return 1
		}
		childArgs := slices.Clone(args)
		if name != "" {
			childArgs = append(childArgs, "--config="+filepath.Join(pn.dir, name))
		}
		pn.log.Info("per-node config", "label", pn.label, "config", name, "dir", pn.dir)
		child, cancel := context.WithCancel(ctx)
		changed := make(chan string, 1)
		go func() {
			t := time.NewTicker(configLabelPoll)
			defer t.Stop()
			for {
				select {
				case <-child.Done():
					return
				case <-t.C:
				}
				n, c, err := pn.current(child)
				if err != nil {
					pn.log.Warn("per-node config: keeping the current one", "config", name, "err", err)
					continue
				}
				if n != name || !bytes.Equal(c, content) {
					changed <- n
					cancel()
					return
				}
			}
		}()
		code := run(child, childArgs, childEnv, stdout, stderr)
		cancel()
		select {
		case n := <-changed:
			if ctx.Err() != nil {
				return code
			}
			pn.log.Info("per-node config changed: restarting the plugin with it", "from", name, "to", n)
			if pn.client != nil {
				postNodeEvent(pn.client, pn.node, "Normal", "ConfigChanged",
					fmt.Sprintf("device plugin config %q in place of %q (label %s)", n, name, pn.label), pn.log)
			}
		default:
			return code
		}
	}
}
