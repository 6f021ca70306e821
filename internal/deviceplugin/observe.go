package deviceplugin

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/health"
	"github.com/gantry-gpu/gantry/internal/kubeapi"
	"github.com/gantry-gpu/gantry/internal/labels"
	"github.com/gantry-gpu/gantry/internal/metrics"
)

// Observability settings, read from the environment (the DaemonSet and the
// Helm chart set them; see deployments/):
//
//	GANTRY_LABELS        off (default), node (patch this Node's labels through
//	                     the API server, needs NODE_NAME and RBAC to patch
//	                     nodes) or file (a node-feature-discovery feature file)
//	GANTRY_FEATURE_FILE  the feature file (default labels' DefaultFeatureFile)
//	GANTRY_METRICS_ADDR  host:port for Prometheus /metrics (empty: off)
//	GANTRY_POD_RESOURCES_SOCKET  the kubelet's pod-resources socket
//	                     (default /var/lib/kubelet/pod-resources/kubelet.sock)
//	NODE_NAME            this node (downward API spec.nodeName); with
//	                     GANTRY_LABELS=node, health changes are also posted as
//	                     Kubernetes Events on the Node
//	KUBECONFIG           with GANTRY_LABELS=node, the API server is reached
//	                     through this kubeconfig, not the service account
//	                     (kubeapi.FromEnvironment)
type observability struct {
	labelsMode, featureFile, metricsAddr, podResources, nodeName string
	getenv                                                       func(string) string // for the API server's settings
}

// DefaultPodResourcesSocket is the kubelet's pod-resources API socket.
const DefaultPodResourcesSocket = "/var/lib/kubelet/pod-resources/kubelet.sock"

// labelInterval is how often labels are rewritten (GFD's default sleep
// interval): a relabelled or recreated Node gets them back.
const labelInterval = time.Minute

func observabilityFromEnv(getenv func(string) string) (observability, error) {
	o := observability{
		labelsMode:   strings.ToLower(strings.TrimSpace(getenv("GANTRY_LABELS"))),
		featureFile:  getenv("GANTRY_FEATURE_FILE"),
		metricsAddr:  getenv("GANTRY_METRICS_ADDR"),
		podResources: getenv("GANTRY_POD_RESOURCES_SOCKET"),
		nodeName:     getenv("NODE_NAME"),
		getenv:       getenv,
	}
	switch o.labelsMode {
	case "", "off":
		o.labelsMode = "off"
	case "node":
		if o.nodeName == "" {
			return o, errors.New("GANTRY_LABELS=node: NODE_NAME is not set; set it from the downward API (fieldRef spec.nodeName)")
		}
	case "file":
	default:
		return o, fmt.Errorf("GANTRY_LABELS=%q: use off, node or file", o.labelsMode)
	}
	if o.featureFile == "" {
		o.featureFile = labels.DefaultFeatureFile
	}
	if o.podResources == "" {
		o.podResources = DefaultPodResourcesSocket
	}
	if o.metricsAddr != "" {
		if _, _, err := net.SplitHostPort(o.metricsAddr); err != nil {
			return o, fmt.Errorf("GANTRY_METRICS_ADDR=%q: want host:port, e.g. :9401", o.metricsAddr)
		}
	}
	return o, nil
}

// labelConfig is the part of the plugin configuration the labels show.
func labelConfig(cfg Config) labels.Config {
	lc := labels.Config{MIGStrategy: cfg.Flags.MigStrategy, Machine: labels.MachineType("")}
	if ts, _ := cfg.replicated(); ts != nil {
		lc.SharingStrategy = labels.SharingTimeSlicing
		if ts == cfg.Sharing.MPS {
			lc.SharingStrategy = labels.SharingMPS
		}
		for _, r := range ts.Resources {
			lc.Replicas = max(lc.Replicas, r.Replicas)
			lc.SharedResources = append(lc.SharedResources, r.Name)
			lc.Renamed = lc.Renamed || r.Rename != ""
		}
	}
	return lc
}

// startObservability starts what o asks for; the returned function stops it.
// It fails only on settings that cannot work (an unwritable label target is
// logged and retried, a kubelet without pod-resources gives metrics without
// pod labels).
func startObservability(ctx context.Context, o observability, cfg Config, sys *gpu.System, p *Plugin, log *slog.Logger) (func(), error) {
	var stops []func()
	stop := func() {
		for i := len(stops) - 1; i >= 0; i-- {
			stops[i]()
		}
	}
	simulated := strings.HasPrefix(cfg.Gantry.GPUs, "sim:")

	var client *kubeapi.Client
	if o.labelsMode == "node" {
		w, err := labels.NewNodeWriterEnv(o.nodeName, o.getenv)
		if err != nil {
			return stop, err
		}
		client = w.Client
		set, err := labels.Generate(sys, labelConfig(cfg), labels.Catalog{Simulated: simulated})
		if err != nil {
			return stop, err
		}
		go loop(ctx, labelInterval, func() {
			if err := w.Write(ctx, set); err != nil {
				log.Warn("writing node labels", "node", o.nodeName, "err", err)
			}
		})
	}
	if o.labelsMode == "file" {
		set, err := labels.Generate(sys, labelConfig(cfg), labels.Catalog{Simulated: simulated})
		if err != nil {
			return stop, err
		}
		go loop(ctx, labelInterval, func() {
			if err := labels.WriteFeatureFile(o.featureFile, set); err != nil {
				log.Warn("writing the feature file", "file", o.featureFile, "err", err)
			}
		})
	}
	if client != nil {
		p.OnHealthChange(func(ev health.Event) { postHealthEvent(client, o.nodeName, ev, log) })
		for _, w := range p.cfg.Warnings() {
			postNodeEvent(client, o.nodeName, "Warning", "ConfigIgnored", w, log)
		}
	}

	if o.metricsAddr != "" {
		var reader metrics.Reader
		if simulated {
			reader = metrics.NewSim(sys)
		} else {
			r, unload, err := metrics.NewNVML(cfg.Flags.NvidiaDriverRoot)
			if err != nil {
				log.Warn("GPU readings unavailable in /metrics", "err", err)
			} else {
				reader = r
				stops = append(stops, unload)
			}
		}
		pr, err := metrics.DialPodResources(o.podResources)
		if err != nil {
			log.Warn("pod labels unavailable in /metrics", "socket", o.podResources, "err", err)
			pr = nil
		}
		exp := metrics.New(metrics.Options{
			System: sys, Reader: reader, PodResources: pr, Logger: log,
			Health: func(uuid string) (bool, uint64) {
				ev, ok := p.Health()[uuid]
				return !ok || ev.Healthy, p.XIDs(uuid)
			},
		})
		ln, err := net.Listen("tcp", o.metricsAddr)
		if err != nil {
			return stop, fmt.Errorf("GANTRY_METRICS_ADDR=%s: %w", o.metricsAddr, err)
		}
		srv := &http.Server{Handler: exp.Mux(), ReadHeaderTimeout: 10 * time.Second}
		go func() {
			if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
				log.Error("metrics server", "err", err)
			}
		}()
		stops = append(stops, func() { _ = srv.Close() })
		log.Info("serving metrics", "addr", ln.Addr().String(), "path", "/metrics")
	}
	return stop, nil
}

// loop runs f now and every interval until ctx is done.
func loop(ctx context.Context, interval time.Duration, f func()) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		f()
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// postHealthEvent records a health change as a Kubernetes Event on the Node,
// where `kubectl describe node` shows it.
func postHealthEvent(c *kubeapi.Client, node string, ev health.Event, log *slog.Logger) {
	typ, reason := "Warning", "GPUUnhealthy"
	if ev.Healthy {
		typ, reason = "Normal", "GPUHealthy"
	}
	postNodeEvent(c, node, typ, reason, fmt.Sprintf("GPU %s: %s", ev.UUID, ev.Reason), log)
}

// postNodeEvent records an Event on the Node.
func postNodeEvent(c *kubeapi.Client, node, typ, reason, msg string, log *slog.Logger) {
	now := time.Now()
	e := &kubeapi.Event{
		// A name of our own (not generateName): unique per change, and the
		// same in every API implementation.
		Metadata:       kubeapi.ObjectMeta{Name: fmt.Sprintf("%s.gantry-gpu.%x", node, now.UnixNano()), Namespace: "default"},
		InvolvedObject: kubeapi.ObjectReference{Kind: "Node", Name: node, APIVersion: "v1"},
		Reason:         reason,
		Message:        msg,
		Type:           typ,
		Source:         kubeapi.EventSource{Component: "gantry-device-plugin", Host: node},
		FirstTimestamp: kubeapi.Time{Time: now}, LastTimestamp: kubeapi.Time{Time: now}, Count: 1,
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if err := c.CreateEvent(ctx, e); err != nil {
		log.Warn("posting an event on the node", "node", node, "reason", reason, "err", err)
	}
}
