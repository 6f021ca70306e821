package health

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Event is one change of a device's health.
type Event struct {
	// UUID is the GPU or MIG device, as Run was given it.
	UUID string
	// Healthy is the new state.
	Healthy bool
	// Reason says why, for logs, metrics and Kubernetes events:
	// "XID 79 (GPU has fallen off the bus)", "double-bit ECC error",
	// "recovered: no critical event for 5m0s".
	Reason string
	// XID is the XID that made the device unhealthy; 0 for other causes.
	XID uint64
	// Time is when the change was seen.
	Time time.Time
}

// Policy decides which events make a device unhealthy and when it recovers.
type Policy struct {
	// IgnoredXIDs are application errors that leave the GPU healthy.
	IgnoredXIDs map[uint64]bool
	// RecoveryQuiet is how long a device must go without a critical event
	// to become healthy again; 0 means never (NVIDIA's behaviour).
	RecoveryQuiet time.Duration
	// Log receives the source's own messages (ignored XIDs, NVML trouble);
	// nil means slog.Default(). State changes are the caller's to log, from
	// the events it receives; they are logged here at debug level only.
	Log *slog.Logger
}

// logger is p.Log, or slog.Default() when unset.
func (p Policy) logger() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.Default()
}

// Source watches devices. Run sends an Event on out for every state change of
// one of uuids (unhealthy with a reason, healthy again after recovery) and
// nothing else; all devices start healthy. It returns nil once ctx is done,
// or an error when it cannot watch at all.
type Source interface {
	Run(ctx context.Context, uuids []string, out chan<- Event) error
}

// DefaultIgnoredXIDs are the XIDs NVIDIA's k8s-device-plugin treats as
// application errors: the GPU stays healthy.
var DefaultIgnoredXIDs = []uint64{13, 31, 43, 45, 68, 109}

// DefaultRecoveryQuiet is DefaultPolicy's quiet period before recovery.
const DefaultRecoveryQuiet = 10 * time.Minute

// DefaultPolicy ignores DefaultIgnoredXIDs and recovers a device after
// DefaultRecoveryQuiet without a critical event.
func DefaultPolicy() Policy {
	p := Policy{IgnoredXIDs: map[uint64]bool{}, RecoveryQuiet: DefaultRecoveryQuiet}
	for _, x := range DefaultIgnoredXIDs {
		p.IgnoredXIDs[x] = true
	}
	return p
}

// Ignores reports whether xid is an application error under p.
func (p Policy) Ignores(xid uint64) bool { return p.IgnoredXIDs[xid] }

// Env variables of NVIDIA's k8s-device-plugin that ParseDisable and
// ParseEnable read.
const (
	EnvDisableHealthChecks = "DP_DISABLE_HEALTHCHECKS"
	EnvEnableHealthChecks  = "DP_ENABLE_HEALTHCHECKS"
)

// ParseDisable reads a DP_DISABLE_HEALTHCHECKS value: "all", or a
// comma-separated list that contains "xids", disables health checks; a list
// of XID numbers adds them to the ignored set. Empty means nothing changes.
func ParseDisable(value string) (disabled bool, extraIgnored []uint64, err error) {
	return parseXIDList(EnvDisableHealthChecks, value)
}

// ParseEnable reads a DP_ENABLE_HEALTHCHECKS value: XID numbers to take out of
// the ignored set (defaults included), or "all" (or "xids") to ignore no XID.
func ParseEnable(value string) (all bool, xids []uint64, err error) {
	return parseXIDList(EnvEnableHealthChecks, value)
}

// parseXIDList parses "a, b, c"; an "all" or "xids" entry means every XID
// (NVIDIA's plugin accepts both words in both variables).
func parseXIDList(name, value string) (all bool, xids []uint64, err error) {
	for f := range strings.SplitSeq(value, ",") {
		f = strings.ToLower(strings.TrimSpace(f))
		switch f {
		case "":
			continue
		case "all", "xids":
			all = true
			continue
		}
		x, perr := strconv.ParseUint(f, 10, 64)
		if perr != nil || x == 0 {
			return false, nil, fmt.Errorf("%s=%q: %q is not an XID; use \"all\" or comma-separated XID numbers such as 48,79", name, value, f)
		}
		if !slices.Contains(xids, x) {
			xids = append(xids, x)
		}
	}
	if all {
		return true, nil, nil
	}
	return false, xids, nil
}

// PolicyFromEnv applies DP_DISABLE_HEALTHCHECKS (disable) and
// DP_ENABLE_HEALTHCHECKS (enable) to DefaultPolicy the way NVIDIA's plugin
// does. disabled means health checking is off: run no Source.
func PolicyFromEnv(disable, enable string) (p Policy, disabled bool, err error) {
	p = DefaultPolicy()
	off, extra, err := ParseDisable(disable)
	if err != nil {
		return p, false, err
	}
	enableAll, enabled, err := ParseEnable(enable)
	if err != nil {
		return p, false, err
	}
	if off {
		// NVIDIA's plugin stops all checks here, even when some XIDs are
		// enabled explicitly; do the same so that manifests behave alike.
		return p, true, nil
	}
	for _, x := range extra {
		p.IgnoredXIDs[x] = true
	}
	if enableAll {
		clear(p.IgnoredXIDs)
	}
	for _, x := range enabled {
		delete(p.IgnoredXIDs, x)
	}
	return p, false, nil
}
