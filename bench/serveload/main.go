// Command serveload holds many idle connections open to a `gantry serve`
// and times real requests behind them, for bench/serve-idle.sh. It talks
// only to the address it is given (loopback in the script), makes a bounded
// number of connections and requests, and stops by itself.
//
//	serveload [-idle 10000] [-requests 50] [-path /gpu/status] [-pid PID] ADDR
//
// It opens -idle TCP connections that never send a byte, then makes
// -requests GETs of -path, each on a new connection, and prints their p50,
// p90 and max latency in ms, how many of its idle connections the server
// had closed by then, and (with -pid, the server's) the server's open file
// descriptors and VmRSS.
package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"slices"
	"strings"
	"time"
)

func main() {
	idle := flag.Int("idle", 10000, "idle connections to open (at most 50000)")
	requests := flag.Int("requests", 50, "timed requests (at most 10000)")
	path := flag.String("path", "/gpu/status", "the path requested")
	pid := flag.Int("pid", 0, "the server's PID, for its file descriptors and memory")
	flag.Parse()
	if flag.NArg() != 1 || *idle < 0 || *idle > 50000 || *requests < 1 || *requests > 10000 {
		fmt.Fprintln(os.Stderr, "usage: serveload [-idle N<=50000] [-requests N<=10000] [-path P] [-pid PID] HOST:PORT")
		os.Exit(2)
	}
	addr := flag.Arg(0)
	host, _, err := net.SplitHostPort(addr)
	if ip := net.ParseIP(host); err != nil || ip == nil || !ip.IsLoopback() {
		fmt.Fprintf(os.Stderr, "serveload: %s: give a loopback HOST:PORT (this is a load test)\n", addr)
		os.Exit(2)
	}
	conns := make([]net.Conn, 0, *idle)
	defer func() {
		for _, c := range conns {
			c.Close()
		}
	}()
	start := time.Now()
	for range *idle {
		c, err := net.DialTimeout("tcp", addr, 5*time.Second)
		if err != nil {
			fmt.Fprintf(os.Stderr, "serveload: idle connection %d: %v\n", len(conns), err)
			break
		}
		conns = append(conns, c)
	}
	fmt.Printf("opened %d idle connections in %.0f ms\n", len(conns), ms(time.Since(start)))

	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}
	var lat []time.Duration
	failed := 0
	for range *requests {
		t := time.Now()
		resp, err := client.Get("http://" + addr + *path)
		if err == nil {
			_, err = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if err == nil && resp.StatusCode != http.StatusOK {
				err = errors.New(resp.Status)
			}
		}
		if err != nil {
			failed++
			fmt.Fprintf(os.Stderr, "serveload: GET %s: %v\n", *path, err)
			continue
		}
		lat = append(lat, time.Since(t))
	}
	closed := 0
	for _, c := range conns {
		c.SetReadDeadline(time.Now().Add(time.Millisecond))
		var b [1]byte
		if _, err := c.Read(b[:]); err != nil {
			var ne net.Error
			if !errors.As(err, &ne) || !ne.Timeout() {
				closed++
			}
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		q := func(p int) float64 { return ms(lat[(len(lat)-1)*p/100]) }
		fmt.Printf("GET %s behind %d idle connections: n=%d p50=%.2f ms p90=%.2f ms max=%.2f ms, %d failed\n", *path, len(conns), len(lat), q(50), q(90), q(100), failed)
	} else {
		fmt.Printf("GET %s: all %d requests failed\n", *path, failed)
	}
	fmt.Printf("idle connections closed by the server: %d of %d\n", closed, len(conns))
	if *pid > 0 {
		fds, _ := os.ReadDir(fmt.Sprintf("/proc/%d/fd", *pid))
		rss := ""
		if b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", *pid)); err == nil {
			for _, l := range strings.Split(string(b), "\n") {
				if strings.HasPrefix(l, "VmRSS:") || strings.HasPrefix(l, "VmHWM:") {
					rss += " " + strings.Join(strings.Fields(l), " ")
				}
			}
		}
		fmt.Printf("server: %d open file descriptors,%s\n", len(fds), rss)
	}
	if failed > 0 {
		os.Exit(1)
	}
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
