package health

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"time"
)

// clock is time as the watch loop sees it; tests use a fake one to step
// through quiet periods without waiting.
type clock interface {
	Now() time.Time
	// at returns a channel that receives once the clock reaches t, and a
	// function that releases it early.
	at(t time.Time) (<-chan time.Time, func())
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

func (realClock) at(t time.Time) (<-chan time.Time, func()) {
	timer := time.NewTimer(time.Until(t))
	return timer.C, func() { timer.Stop() }
}

// kind is what a source saw on a device.
type kind int

const (
	kindXID   kind = iota + 1 // an XID error; critical unless ignored
	kindDBE                   // double-bit (uncorrectable) ECC error; critical
	kindSBE                   // single-bit (corrected) ECC error; ignored
	kindLost                  // NVML reports the GPU lost; critical
	kindReset                 // the GPU was reset; recovers at once
)

// observation is one thing a source saw on one device.
type observation struct {
	uuid string
	kind kind
	xid  uint64
}

// tracker holds the health of the watched devices and turns observations
// into state changes. It is pure: time comes in as arguments.
type tracker struct {
	p       Policy
	watched map[string]bool
	// lastCritical holds the unhealthy devices and their latest critical
	// event, from which the quiet period runs.
	lastCritical map[string]time.Time
	// probe, when set, is asked before a device recovers by quiet period;
	// an error keeps it unhealthy for another period.
	probe func(uuid string) error
	log   *slog.Logger
}

func newTracker(p Policy, uuids []string, probe func(string) error, log *slog.Logger) *tracker {
	t := &tracker{p: p, watched: map[string]bool{}, lastCritical: map[string]time.Time{}, probe: probe, log: log}
	for _, u := range uuids {
		t.watched[u] = true
	}
	return t
}

// errUnknownDevice is returned for an observation on a device not watched.
var errUnknownDevice = errors.New("not a watched device; use a UUID the device plugin advertises")

// observe applies o, seen at now. It returns the resulting Event when the
// device's state changed.
func (t *tracker) observe(o observation, now time.Time) (Event, bool, error) {
	if !t.watched[o.uuid] {
		return Event{}, false, fmt.Errorf("%s: %w", o.uuid, errUnknownDevice)
	}
	var reason string
	var xid uint64
	switch o.kind {
	case kindXID:
		if t.p.Ignores(o.xid) {
			t.log.Info("ignoring application XID", "uuid", o.uuid, "xid", o.xid, "description", DescribeXID(o.xid))
			return Event{}, false, nil
		}
		reason, xid = DescribeXID(o.xid), o.xid
	case kindDBE:
		reason = "double-bit ECC error"
	case kindLost:
		reason = "GPU is lost (NVML cannot reach it)"
	case kindSBE:
		t.log.Debug("ignoring corrected single-bit ECC error", "uuid", o.uuid)
		return Event{}, false, nil
	case kindReset:
		if _, bad := t.lastCritical[o.uuid]; !bad {
			return Event{}, false, nil
		}
		delete(t.lastCritical, o.uuid)
		return Event{UUID: o.uuid, Healthy: true, Reason: "recovered: GPU reset", Time: now}, true, nil
	default:
		return Event{}, false, fmt.Errorf("unknown observation kind %d", o.kind)
	}
	_, already := t.lastCritical[o.uuid]
	t.lastCritical[o.uuid] = now
	if already {
		t.log.Info("critical event on an unhealthy device; quiet period restarted", "uuid", o.uuid, "reason", reason)
		return Event{}, false, nil
	}
	return Event{UUID: o.uuid, Healthy: false, Reason: reason, XID: xid, Time: now}, true, nil
}

// expire recovers the devices whose quiet period has passed by now, in UUID
// order.
func (t *tracker) expire(now time.Time) []Event {
	if t.p.RecoveryQuiet <= 0 {
		return nil
	}
	var events []Event
	for _, u := range slices.Sorted(maps.Keys(t.lastCritical)) {
		if now.Before(t.lastCritical[u].Add(t.p.RecoveryQuiet)) {
			continue
		}
		if t.probe != nil {
			if err := t.probe(u); err != nil {
				t.log.Warn("quiet period over but the device does not answer; staying unhealthy", "uuid", u, "error", err)
				t.lastCritical[u] = now
				continue
			}
		}
		delete(t.lastCritical, u)
		events = append(events, Event{UUID: u, Healthy: true, Reason: fmt.Sprintf("recovered: no critical event for %s", t.p.RecoveryQuiet), Time: now})
	}
	return events
}

// next is when the earliest quiet period ends; false when none is running.
func (t *tracker) next() (time.Time, bool) {
	if t.p.RecoveryQuiet <= 0 || len(t.lastCritical) == 0 {
		return time.Time{}, false
	}
	var first time.Time
	for _, last := range t.lastCritical {
		if end := last.Add(t.p.RecoveryQuiet); first.IsZero() || end.Before(first) {
			first = end
		}
	}
	return first, true
}

// request carries an observation to the watch loop; reply, when set, gets
// the verdict (nil, or why the observation was refused) before any Event is
// sent.
type request struct {
	obs   observation
	reply chan<- error
}

// watch runs the tracker until ctx is done: observations come in on in,
// quiet periods end by clk, state changes go out.
func watch(ctx context.Context, clk clock, t *tracker, in <-chan request, out chan<- Event) {
	send := func(e Event) bool {
		t.log.Debug("GPU health changed", "uuid", e.UUID, "healthy", e.Healthy, "reason", e.Reason)
		select {
		case out <- e:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		for _, e := range t.expire(clk.Now()) {
			if !send(e) {
				return
			}
		}
		var fire <-chan time.Time
		stop := func() {}
		if end, ok := t.next(); ok {
			fire, stop = clk.at(end)
		}
		select {
		case <-ctx.Done():
			stop()
			return
		case <-fire:
		case r := <-in:
			e, changed, err := t.observe(r.obs, clk.Now())
			if r.reply != nil {
				r.reply <- err
			} else if err != nil {
				t.log.Debug("event for a device not watched", "error", err)
			}
			if changed && !send(e) {
				stop()
				return
			}
		}
		stop()
	}
}
