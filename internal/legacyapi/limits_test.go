package legacyapi

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"
)

func serveWith(t *testing.T, l Limits) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	hs := NewHTTPServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		io.WriteString(w, "ok\n")
	}), l)
	go hs.Serve(ln)
	t.Cleanup(func() { hs.Close() })
	return ln.Addr().String()
}

func getStatus(t *testing.T, addr string) (int, error) {
	t.Helper()
	c := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	resp, err := c.Get("http://" + addr + "/gpu/status")
	if err != nil {
		return 0, err
	}
	resp.Body.Close()
	return resp.StatusCode, nil
}

func TestHeaderTooLarge(t *testing.T) {
	l := DefaultLimits()
	addr := serveWith(t, l)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	io.WriteString(conn, "GET /gpu/status HTTP/1.1\r\nHost: x\r\nX-Big: "+strings.Repeat("a", 2*l.MaxHeaderBytes)+"\r\n\r\n")
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil || !strings.Contains(line, "431") {
		t.Errorf("a %d-byte header: %q, %v; want 431", 2*l.MaxHeaderBytes, line, err)
	}
}

// A client that sends half a header and waits (slowloris) is cut off after
// the header timeout.
func TestSlowHeaderClosed(t *testing.T) {
	l := DefaultLimits()
	l.ReadHeaderTimeout = 200 * time.Millisecond
	addr := serveWith(t, l)
	conn, err := net.Dial("tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "GET /gpu/status HTTP/1.1\r\nHost: x\r\n")
	conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	start := time.Now()
	b, err := io.ReadAll(conn)
	if err != nil {
		t.Fatalf("the server kept the slow connection open for %v: %v", time.Since(start), err)
	}
	if len(b) > 0 && !strings.Contains(string(b), "408") {
		t.Errorf("the server answered %q to a request that never finished its header", b)
	}
}

// Ten times the cap of idle connections (silent, as a flood would be) do not
// lock out a client with a request, and the server holds no more than the
// cap: the oldest idle ones are closed to make room.
func TestIdleConnectionsShed(t *testing.T) {
	l := DefaultLimits()
	l.MaxConns = 20
	addr := serveWith(t, l)
	var idle []net.Conn
	defer func() {
		for _, c := range idle {
			c.Close()
		}
	}()
	for range 10 * l.MaxConns {
		c, err := net.Dial("tcp", addr)
		if err != nil {
			t.Fatalf("dial %d: %v", len(idle), err)
		}
		idle = append(idle, c)
	}
	for i := range 5 {
		code, err := getStatus(t, addr)
		if err != nil || code != http.StatusOK {
			t.Fatalf("request %d behind %d idle connections: %d, %v", i, len(idle), code, err)
		}
	}
	// The server closed all but the cap of them: reads see EOF.
	open := 0
	for _, c := range idle {
		c.SetReadDeadline(time.Now().Add(20 * time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			if ne, ok := err.(net.Error); ok && ne.Timeout() {
				open++
			}
		}
	}
	if open > l.MaxConns {
		t.Errorf("%d of %d idle connections still open, want at most the cap %d", open, len(idle), l.MaxConns)
	}
}
