package health

import (
	"errors"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"
)

var quietLog = slog.New(slog.NewTextHandler(io.Discard, nil))

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)

// step is one observation or clock reading in a tracker scenario.
type step struct {
	at   time.Duration // since t0
	obs  *observation  // nil: just expire at this time
	want []Event       // events expected at this step (Time filled from at)
}

func TestTracker(t *testing.T) {
	const a, b = "GPU-a", "GPU-b"
	xid := func(u string, x uint64) *observation { return &observation{uuid: u, kind: kindXID, xid: x} }
	unhealthy := func(u, reason string, x uint64) Event { return Event{UUID: u, Reason: reason, XID: x} }
	recovered := func(u string) Event {
		return Event{UUID: u, Healthy: true, Reason: "recovered: no critical event for 5m0s"}
	}
	tests := []struct {
		name  string
		quiet time.Duration
		probe func(string) error
		steps []step
	}{
		{name: "ignored xid", quiet: 5 * time.Minute, steps: []step{
			{obs: xid(a, 13)}, {obs: xid(a, 109)}, {at: time.Hour},
		}},
		{name: "critical then recovery", quiet: 5 * time.Minute, steps: []step{
			{obs: xid(a, 79), want: []Event{unhealthy(a, "XID 79 (GPU has fallen off the bus)", 79)}},
			{at: 4 * time.Minute},
			{at: 5 * time.Minute, want: []Event{recovered(a)}},
			{at: 6 * time.Minute},
		}},
		{name: "repeat restarts the quiet period", quiet: 5 * time.Minute, steps: []step{
			{obs: xid(a, 79), want: []Event{unhealthy(a, "XID 79 (GPU has fallen off the bus)", 79)}},
			{at: 4 * time.Minute, obs: &observation{uuid: a, kind: kindDBE}},
			{at: 8 * time.Minute},
			{at: 9 * time.Minute, want: []Event{recovered(a)}},
		}},
		{name: "never recovers with quiet 0", steps: []step{
			{obs: xid(a, 48), want: []Event{unhealthy(a, "XID 48 (double-bit ECC error)", 48)}},
			{at: 1000 * time.Hour},
		}},
		{name: "reset recovers at once", steps: []step{
			{obs: &observation{uuid: b, kind: kindReset}},
			{obs: &observation{uuid: b, kind: kindDBE}, want: []Event{unhealthy(b, "double-bit ECC error", 0)}},
			{at: time.Second, obs: &observation{uuid: b, kind: kindReset}, want: []Event{{UUID: b, Healthy: true, Reason: "recovered: GPU reset"}}},
		}},
		{name: "sbe ignored, lost critical", quiet: time.Minute, steps: []step{
			{obs: &observation{uuid: a, kind: kindSBE}},
			{obs: &observation{uuid: b, kind: kindLost}, want: []Event{unhealthy(b, "GPU is lost (NVML cannot reach it)", 0)}},
		}},
		{name: "two devices recover in UUID order", quiet: 5 * time.Minute, steps: []step{
			{obs: xid(b, 79), want: []Event{unhealthy(b, "XID 79 (GPU has fallen off the bus)", 79)}},
			{obs: xid(a, 74), want: []Event{unhealthy(a, "XID 74 (NVLink error)", 74)}},
			{at: 5 * time.Minute, want: []Event{recovered(a), recovered(b)}},
		}},
		{name: "probe failure keeps it unhealthy", quiet: 5 * time.Minute, probe: func(string) error { return errLost }, steps: []step{
			{obs: xid(a, 79), want: []Event{unhealthy(a, "XID 79 (GPU has fallen off the bus)", 79)}},
			{at: 5 * time.Minute},
			{at: 10 * time.Minute},
		}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newTracker(Policy{IgnoredXIDs: DefaultPolicy().IgnoredXIDs, RecoveryQuiet: tt.quiet}, []string{a, b}, tt.probe, quietLog)
			for i, s := range tt.steps {
				now := t0.Add(s.at)
				var got []Event
				if s.obs != nil {
					e, changed, err := tr.observe(*s.obs, now)
					if err != nil {
						t.Fatalf("step %d: %v", i, err)
					}
					if changed {
						got = append(got, e)
					}
				}
				got = append(got, tr.expire(now)...)
				if len(got) != len(s.want) {
					t.Fatalf("step %d: events %+v, want %+v", i, got, s.want)
				}
				for j := range got {
					w := s.want[j]
					w.Time = now
					if got[j] != w {
						t.Errorf("step %d: event %+v, want %+v", i, got[j], w)
					}
				}
			}
		})
	}
}

func TestTrackerUnknownDevice(t *testing.T) {
	tr := newTracker(DefaultPolicy(), []string{"GPU-a"}, nil, quietLog)
	_, _, err := tr.observe(observation{uuid: "GPU-x", kind: kindXID, xid: 79}, t0)
	if !errors.Is(err, errUnknownDevice) {
		t.Errorf("observe on an unknown device: %v", err)
	}
}

func TestTrackerNext(t *testing.T) {
	tr := newTracker(Policy{RecoveryQuiet: time.Minute}, []string{"GPU-a", "GPU-b"}, nil, quietLog)
	if _, ok := tr.next(); ok {
		t.Error("next with every device healthy")
	}
	tr.observe(observation{uuid: "GPU-a", kind: kindDBE}, t0.Add(10*time.Second))
	tr.observe(observation{uuid: "GPU-b", kind: kindDBE}, t0)
	if end, ok := tr.next(); !ok || !end.Equal(t0.Add(time.Minute)) {
		t.Errorf("next = %v, %v; want %v", end, ok, t0.Add(time.Minute))
	}
}

// fakeClock moves only when told to.
type fakeClock struct {
	mu      sync.Mutex
	now     time.Time
	waiters map[chan time.Time]time.Time
}

func newFakeClock() *fakeClock {
	return &fakeClock{now: t0, waiters: map[chan time.Time]time.Time{}}
}

func (f *fakeClock) Now() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *fakeClock) at(t time.Time) (<-chan time.Time, func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	c := make(chan time.Time, 1)
	if !t.After(f.now) {
		c <- f.now
		return c, func() {}
	}
	f.waiters[c] = t
	return c, func() {
		f.mu.Lock()
		defer f.mu.Unlock()
		delete(f.waiters, c)
	}
}

func (f *fakeClock) Advance(d time.Duration) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.now = f.now.Add(d)
	for c, t := range f.waiters {
		if !t.After(f.now) {
			c <- f.now
			delete(f.waiters, c)
		}
	}
}
