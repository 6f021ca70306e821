package legacyapi

import (
	"net"
	"net/http"
	"sync"
	"time"
)

// Limits bound what clients can make the server hold. The API is read-only
// and small, so the bounds are tight: a request that needs more than a few
// seconds to send its header, or a connection idle for half a minute, is a
// client that will not be missed.
type Limits struct {
	// MaxConns is how many connections are kept open at once. Past it, the
	// connection idle the longest (or never sending a request) is closed to
	// make room: an idle client cannot lock out one with a request.
	MaxConns int
	// ReadHeaderTimeout, ReadTimeout, WriteTimeout and IdleTimeout are
	// http.Server's.
	ReadHeaderTimeout, ReadTimeout, WriteTimeout, IdleTimeout time.Duration
	// MaxHeaderBytes is http.Server's; larger headers get 431.
	MaxHeaderBytes int
}

// DefaultLimits are the bounds `gantry serve` runs with.
func DefaultLimits() Limits {
	return Limits{
		MaxConns:          256,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		IdleTimeout:       30 * time.Second,
		MaxHeaderBytes:    16 << 10,
	}
}

// NewHTTPServer returns an http.Server for h with the limits l applied.
func NewHTTPServer(h http.Handler, l Limits) *http.Server {
	t := &connTracker{max: l.MaxConns, conns: map[net.Conn]*connInfo{}}
	return &http.Server{
		Handler:           h,
		ReadHeaderTimeout: l.ReadHeaderTimeout,
		ReadTimeout:       l.ReadTimeout,
		WriteTimeout:      l.WriteTimeout,
		IdleTimeout:       l.IdleTimeout,
		MaxHeaderBytes:    l.MaxHeaderBytes,
		ConnState:         t.update,
	}
}

// connTracker sheds connections over the cap: on each new one, the oldest
// connection that is not serving a request (new and silent, or idle between
// requests) is closed. Requests being served are never cut. When every
// connection is busy, the new one is closed instead.
type connTracker struct {
	max   int
	mu    sync.Mutex
	conns map[net.Conn]*connInfo
}

type connInfo struct {
	state http.ConnState
	since time.Time
}

func (t *connTracker) update(c net.Conn, s http.ConnState) {
	if t.max <= 0 {
		return
	}
	t.mu.Lock()
	var victim net.Conn
	switch s {
	case http.StateClosed, http.StateHijacked:
		delete(t.conns, c)
	case http.StateNew:
		t.conns[c] = &connInfo{state: s, since: time.Now()}
		if len(t.conns) > t.max {
			victim = t.oldestIdle()
			if victim == nil {
				victim = c
			}
			// Forget it now: its StateClosed comes later, and until then
			// it must not count, nor be chosen twice.
			delete(t.conns, victim)
		}
	default:
		if ci := t.conns[c]; ci != nil {
			ci.state, ci.since = s, time.Now()
		}
	}
	t.mu.Unlock()
	if victim != nil {
		victim.Close()
	}
}

func (t *connTracker) oldestIdle() net.Conn {
	var oldest net.Conn
	var at time.Time
	for c, ci := range t.conns {
		if ci.state == http.StateActive {
			continue
		}
		if oldest == nil || ci.since.Before(at) {
			oldest, at = c, ci.since
		}
	}
	return oldest
}
