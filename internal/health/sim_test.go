package health

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gantry-gpu/gantry/internal/gpu/sim"
)

// simUUIDs returns the GPU UUIDs of a built-in simulated profile.
func simUUIDs(tb testing.TB, profile string) []string {
	tb.Helper()
	sys, err := sim.Load(profile)
	if err != nil {
		tb.Fatal(err)
	}
	var uuids []string
	for _, d := range sys.Devices {
		uuids = append(uuids, d.UUID)
	}
	return uuids
}

// startSim runs a simulated source on a fresh socket until the test ends and
// returns the socket, the event channel and the channel Run's result lands on.
func startSim(tb testing.TB, p Policy, clk clock, uuids []string) (string, <-chan Event, <-chan error) {
	tb.Helper()
	dir, err := os.MkdirTemp("", "health")
	if err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { os.RemoveAll(dir) })
	path := filepath.Join(dir, "health.sock")
	src := NewSim(path, p).(*simSource)
	src.log = quietLog
	if clk != nil {
		src.clk = clk
	}
	ctx, cancel := context.WithCancel(context.Background())
	out := make(chan Event)
	done := make(chan error, 1)
	go func() { done <- src.Run(ctx, uuids, out) }()
	tb.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			tb.Errorf("Run: %v", err)
		}
	})
	// Wait for the socket: a comment line is answered "ok" and changes nothing.
	for i := 0; ; i++ {
		err := InjectSim(path, "# ready?")
		if err == nil {
			break
		}
		select {
		case err := <-done:
			tb.Fatalf("Run ended before listening: %v", err)
		default:
		}
		if i == 1000 {
			tb.Fatalf("the simulated source never listened: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
	return path, out, done
}

func inject(tb testing.TB, path, line string) {
	tb.Helper()
	if err := InjectSim(path, line); err != nil {
		tb.Fatal(err)
	}
}

func next(tb testing.TB, out <-chan Event) Event {
	tb.Helper()
	select {
	case e := <-out:
		return e
	case <-time.After(30 * time.Second):
		tb.Fatal("no event within 30s")
		return Event{}
	}
}

func TestSimEndToEnd(t *testing.T) {
	uuids := simUUIDs(t, "h100x8")
	clk := newFakeClock()
	p := DefaultPolicy()
	p.RecoveryQuiet = 5 * time.Minute
	path, out, _ := startSim(t, p, clk, uuids)

	fi, err := os.Stat(path)
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Errorf("socket %s: %v, mode %v; want 0600", path, err, fi.Mode().Perm())
	}

	// Application XIDs and corrected ECC errors change nothing, nor does a
	// reset of a healthy GPU: the first event is the critical XID's.
	inject(t, path, "xid "+uuids[0]+" 13")
	inject(t, path, "XID "+uuids[0]+" 31")
	inject(t, path, "ecc "+uuids[0]+" sbe")
	inject(t, path, "reset "+uuids[0])
	inject(t, path, "xid "+uuids[0]+" 79")
	e := next(t, out)
	want := Event{UUID: uuids[0], Reason: "XID 79 (GPU has fallen off the bus)", XID: 79, Time: t0}
	if e != want {
		t.Fatalf("event %+v, want %+v", e, want)
	}

	// A second critical event on the unhealthy GPU restarts its quiet period
	// and sends nothing.
	clk.Advance(4 * time.Minute)
	inject(t, path, "ecc "+uuids[0]+" dbe")
	clk.Advance(2 * time.Minute) // 6m after the first, 2m after the second

	// A double-bit ECC error on another GPU, then its reset.
	inject(t, path, "ecc "+uuids[3]+" dbe")
	if e := next(t, out); e != (Event{UUID: uuids[3], Reason: "double-bit ECC error", Time: t0.Add(6 * time.Minute)}) {
		t.Fatalf("event %+v", e)
	}
	inject(t, path, "reset "+uuids[3])
	if e := next(t, out); e != (Event{UUID: uuids[3], Healthy: true, Reason: "recovered: GPU reset", Time: t0.Add(6 * time.Minute)}) {
		t.Fatalf("event %+v", e)
	}

	// Had the first GPU recovered 5m after its first event, that event
	// would have come before these; it comes now, 5m after the second.
	clk.Advance(3 * time.Minute)
	want = Event{UUID: uuids[0], Healthy: true, Reason: "recovered: no critical event for 5m0s", Time: t0.Add(9 * time.Minute)}
	if e := next(t, out); e != want {
		t.Fatalf("event %+v, want %+v", e, want)
	}
}

func TestSimRefusesBadCommands(t *testing.T) {
	uuids := simUUIDs(t, "h100x8")
	path, _, _ := startSim(t, DefaultPolicy(), nil, uuids)
	tests := []struct{ line, want string }{
		{"xid GPU-00000000-0000-0000-0000-000000000000 79", "GPU-00000000-0000-0000-0000-000000000000: not a watched device"},
		{"xid " + uuids[0], "xid takes 2 argument(s)"},
		{"xid " + uuids[0] + " seventy", `"seventy" is not an XID number`},
		{"ecc " + uuids[0] + " tbe", `ECC error type "tbe"`},
		{"reboot " + uuids[0], `unknown command "reboot"`},
		{"reset", "reset takes 1 argument(s)"},
		{"xid a 79\nxid b 79", "one command per call"},
	}
	for _, tt := range tests {
		err := InjectSim(path, tt.line)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("InjectSim(%q) = %v, want an error containing %q", tt.line, err, tt.want)
		}
	}
}

func TestSimSocketLifecycle(t *testing.T) {
	dir := t.TempDir()
	// Not a socket: refused, and left alone.
	file := filepath.Join(dir, "file")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	err := NewSim(file, DefaultPolicy()).Run(context.Background(), nil, make(chan Event))
	if err == nil || !strings.Contains(err.Error(), "is not a socket") {
		t.Errorf("Run on a regular file: %v", err)
	}
	if _, err := os.Stat(file); err != nil {
		t.Errorf("the regular file is gone: %v", err)
	}

	// A live socket is not taken over; a stale one is replaced; Run removes
	// its socket when it ends.
	path, _, done := startSim(t, DefaultPolicy(), nil, nil)
	err = NewSim(path, DefaultPolicy()).Run(context.Background(), nil, make(chan Event))
	if err == nil || !strings.Contains(err.Error(), "in use") {
		t.Errorf("Run on a live socket: %v", err)
	}
	_ = done

	stale := filepath.Join(dir, "stale.sock")
	ctx, cancel := context.WithCancel(context.Background())
	first := make(chan error, 1)
	go func() { first <- NewSim(stale, DefaultPolicy()).Run(ctx, nil, make(chan Event)) }()
	for InjectSim(stale, "") != nil {
		time.Sleep(10 * time.Millisecond)
	}
	cancel()
	if err := <-first; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Lstat(stale); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("socket left behind after Run: %v", err)
	}
	long := filepath.Join(dir, strings.Repeat("x", 120))
	if err := NewSim(long, DefaultPolicy()).Run(context.Background(), nil, nil); err == nil || !strings.Contains(err.Error(), "shorter path") {
		t.Errorf("Run on a long path: %v", err)
	}
}

func TestInjectSimNoServer(t *testing.T) {
	err := InjectSim(filepath.Join(t.TempDir(), "none.sock"), "reset GPU-x")
	if err == nil || !strings.Contains(err.Error(), "device plugin running") {
		t.Errorf("InjectSim without a server: %v", err)
	}
}

func FuzzParseCommand(f *testing.F) {
	for _, s := range []string{"xid GPU-1 79", "ecc GPU-1 dbe", "reset GPU-1", "# x", "", "xid a b c", "ECC g SBE"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		o, ok, err := parseCommand(line)
		if err != nil && ok {
			t.Fatalf("parseCommand(%q) ok with error %v", line, err)
		}
		if ok && (o.uuid == "" || o.kind == 0 || (o.kind == kindXID) != (o.xid != 0)) {
			t.Fatalf("parseCommand(%q) = %+v", line, o)
		}
	})
}

// BenchmarkSimEventLatency measures one injection over the socket until its
// Event arrives: alternately a critical XID and a reset of the same GPU.
func BenchmarkSimEventLatency(b *testing.B) {
	uuids := simUUIDs(b, "h100x8")
	path, out, _ := startSim(b, Policy{}, nil, uuids)
	lines := []string{"xid " + uuids[0] + " 79", "reset " + uuids[0]}
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		if err := InjectSim(path, lines[i%2]); err != nil {
			b.Fatal(err)
		}
		if e := <-out; e.Healthy != (i%2 == 1) {
			b.Fatalf("event %+v", e)
		}
	}
}
