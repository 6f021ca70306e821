package metrics

import (
	"context"
	"log/slog"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/gantry-gpu/gantry/internal/gpu"
)

// Options configure an Exporter.
type Options struct {
	// System is the node's GPUs, as the device plugin discovered them.
	System *gpu.System
	// Reader gives the readings; nil leaves the reading metrics out.
	Reader Reader
	// Health gives health and XID counts; nil reports every GPU healthy
	// with no XIDs.
	Health HealthFunc
	// PodResources, when set, adds the pod labels.
	PodResources *PodResources
	// Logger gets read errors; nil discards them.
	Logger *slog.Logger
}

// The per-GPU labels, in order.
var gpuLabels = []string{"gpu", "uuid", "model", "pod", "namespace", "container"}

var (
	descUtil     = desc("gantry_gpu_utilization_percent", "Percent of time the GPU was running a kernel over the last sample period.")
	descMemUtil  = desc("gantry_gpu_memory_utilization_percent", "Percent of time GPU memory was being read or written over the last sample period.")
	descEncUtil  = desc("gantry_gpu_encoder_utilization_percent", "Percent of time the video encoder (NVENC) was busy over the last sample period.")
	descDecUtil  = desc("gantry_gpu_decoder_utilization_percent", "Percent of time the video decoder (NVDEC) was busy over the last sample period.")
	descSMClock  = desc("gantry_gpu_sm_clock_hertz", "Current clock of the streaming multiprocessors, in hertz.")
	descMemClock = desc("gantry_gpu_memory_clock_hertz", "Current memory clock, in hertz.")
	descMemUsed  = desc("gantry_gpu_memory_used_bytes", "GPU memory in use, in bytes.")
	descMemTotal = desc("gantry_gpu_memory_total_bytes", "Total GPU memory, in bytes.")
	descTemp     = desc("gantry_gpu_temperature_celsius", "GPU core temperature, in degrees Celsius.")
	descPower    = desc("gantry_gpu_power_watts", "GPU power draw, in watts.")
	descXID      = desc("gantry_gpu_xid_errors_total", "Critical XID errors that made the GPU unhealthy since the device plugin started (ignored XIDs and XIDs on an already unhealthy GPU are not counted).")
	descHealthy  = desc("gantry_gpu_healthy", "1 when the device plugin considers the GPU healthy, 0 when not.")
	descPRUp     = prometheus.NewDesc("gantry_pod_resources_up", "1 when the kubelet's pod-resources API answered this scrape, 0 when not (the pod labels are then empty).", nil, nil)
)

func desc(name, help string) *prometheus.Desc {
	return prometheus.NewDesc(name, help, gpuLabels, nil)
}

// Exporter is a prometheus.Collector of the node's GPUs.
type Exporter struct {
	opts Options
	byID map[string]int // device ID forms (UUIDs, MIG UUIDs, indices, "0:1") to GPU position
	log  *slog.Logger
	reg  *prometheus.Registry
}

// New makes an Exporter and a registry that holds it (and nothing else).
func New(opts Options) *Exporter {
	e := &Exporter{opts: opts, byID: map[string]int{}, log: opts.Logger}
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if opts.System != nil {
		for i, d := range opts.System.Devices {
			e.byID[d.UUID] = i
			e.byID[strconv.Itoa(d.Index)] = i
			for _, m := range d.MIGDevices {
				e.byID[m.UUID] = i
				e.byID[m.Name()] = i
			}
		}
	}
	e.reg = prometheus.NewRegistry()
	e.reg.MustRegister(e)
	return e
}

// Registry is the registry holding the Exporter; add process or Go
// collectors to it if wanted.
func (e *Exporter) Registry() *prometheus.Registry { return e.reg }

// Handler serves the registry in the Prometheus exposition formats.
func (e *Exporter) Handler() http.Handler {
	return promhttp.HandlerFor(e.reg, promhttp.HandlerOpts{ErrorLog: slog.NewLogLogger(e.log.Handler(), slog.LevelWarn)})
}

// Mux serves Handler on /metrics.
func (e *Exporter) Mux() *http.ServeMux {
	mux := http.NewServeMux()
	mux.Handle("/metrics", e.Handler())
	return mux
}

// Describe implements prometheus.Collector.
func (e *Exporter) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{descUtil, descMemUtil, descEncUtil, descDecUtil, descSMClock, descMemClock, descMemUsed, descMemTotal, descTemp, descPower, descXID, descHealthy, descPRUp} {
		ch <- d
	}
}

// deviceGPU maps a device ID from pod-resources to a GPU position. Replica
// IDs of shared GPUs carry a "::<n>" suffix (NVIDIA's form), which is cut.
func (e *Exporter) deviceGPU(id string) (int, bool) {
	base, _, _ := strings.Cut(id, "::")
	i, ok := e.byID[base]
	return i, ok
}

// Collect implements prometheus.Collector: one reading per GPU per scrape.
func (e *Exporter) Collect(ch chan<- prometheus.Metric) {
	if e.opts.System == nil {
		return
	}
	owners := make([][]Owner, len(e.opts.System.Devices))
	if e.opts.PodResources != nil {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		byID, err := e.opts.PodResources.Owners(ctx)
		cancel()
		up := 1.0
		if err != nil {
			up = 0
			e.log.Warn("pod labels unavailable", "err", err)
		}
		ch <- prometheus.MustNewConstMetric(descPRUp, prometheus.GaugeValue, up)
		for id, os := range byID {
			if i, ok := e.deviceGPU(id); ok {
				for _, o := range os {
					if !slices.Contains(owners[i], o) {
						owners[i] = append(owners[i], o)
					}
				}
			}
		}
	}
	for i, d := range e.opts.System.Devices {
		s := Unknown()
		if e.opts.Reader != nil {
			var err error
			if s, err = e.opts.Reader.Read(d.UUID); err != nil {
				e.log.Warn("reading GPU", "gpu", d.Index, "uuid", d.UUID, "err", err)
				s = Unknown()
			}
		}
		healthy, xids := true, uint64(0)
		if e.opts.Health != nil {
			healthy, xids = e.opts.Health(d.UUID)
		}
		us := owners[i]
		slices.SortFunc(us, func(a, b Owner) int {
			return strings.Compare(a.Namespace+"/"+a.Pod+"/"+a.Container, b.Namespace+"/"+b.Pod+"/"+b.Container)
		})
		if len(us) == 0 {
			us = []Owner{{}}
		}
		for _, o := range us {
			lv := []string{strconv.Itoa(d.Index), d.UUID, d.Name, o.Pod, o.Namespace, o.Container}
			gauge := func(desc *prometheus.Desc, v float64) {
				if !math.IsNaN(v) {
					ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, v, lv...)
				}
			}
			gauge(descUtil, s.UtilizationPercent)
			gauge(descMemUtil, s.MemoryUtilizationPercent)
			gauge(descEncUtil, s.EncoderUtilizationPercent)
			gauge(descDecUtil, s.DecoderUtilizationPercent)
			gauge(descSMClock, s.SMClockMHz*1e6)
			gauge(descMemClock, s.MemoryClockMHz*1e6)
			gauge(descMemUsed, s.MemoryUsedBytes)
			gauge(descMemTotal, s.MemoryTotalBytes)
			gauge(descTemp, s.TemperatureCelsius)
			gauge(descPower, s.PowerWatts)
			ch <- prometheus.MustNewConstMetric(descXID, prometheus.CounterValue, float64(xids), lv...)
			h := 0.0
			if healthy {
				h = 1
			}
			ch <- prometheus.MustNewConstMetric(descHealthy, prometheus.GaugeValue, h, lv...)
		}
	}
}
