package cli

import (
	"bufio"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"syscall"
	"testing"
)

// startServe runs gantry serve in the background and returns its base URL
// and a function that stops it with SIGTERM and returns its exit code.
func startServe(t *testing.T, args ...string) (string, func() int) {
	t.Helper()
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := Main(append([]string{"serve"}, args...), io.Discard, pw)
		pw.Close()
		done <- code
	}()
	sc := bufio.NewScanner(pr)
	var url string
	for sc.Scan() {
		if _, addr, ok := strings.Cut(sc.Text(), "listening on "); ok {
			url = addr
			break
		}
		t.Logf("serve: %s", sc.Text())
	}
	go io.Copy(io.Discard, pr)
	if url == "" {
		t.Fatalf("gantry serve did not start (exit %d)", <-done)
	}
	return url, func() int {
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		return <-done
	}
}

func TestServe(t *testing.T) {
	root := fakeRoot(t)
	url, stop := startServe(t, "--gpus", "sim:h100x8", "--driver-root", root, "--listen", "127.0.0.1:0")
	if !strings.HasPrefix(url, "http://127.0.0.1:") {
		t.Fatalf("url %q", url)
	}

	resp, err := http.Get(url + "/docker/cli?dev=0+1")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "--volume=" + root + "/usr/local/nvidia:/usr/local/nvidia:ro"
	for _, n := range []string{"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidia0", "/dev/nvidia1"} {
		want += " --device=" + root + n + ":" + n
	}
	if resp.StatusCode != 200 || string(b) != want {
		t.Errorf("/docker/cli: %d %q\nwant %q", resp.StatusCode, b, want)
	}

	resp, err = http.Get(url + "/gpu/status/json")
	if err != nil {
		t.Fatal(err)
	}
	var st struct{ Devices []struct{ Temperature *uint } }
	err = json.NewDecoder(resp.Body).Decode(&st)
	resp.Body.Close()
	if err != nil || len(st.Devices) != 8 || st.Devices[0].Temperature == nil {
		t.Errorf("/gpu/status/json: %v %+v", err, st)
	}

	resp, err = http.Post(url+"/gpu/info", "text/plain", strings.NewReader(""))
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusMethodNotAllowed {
		t.Errorf("POST: %d", resp.StatusCode)
	}

	if code := stop(); code != 0 {
		t.Errorf("serve exit %d after SIGTERM", code)
	}
	if _, err := http.Get(url + "/gpu/info"); err == nil {
		t.Errorf("server still answers after SIGTERM")
	}
}

func TestServeRefusesRemote(t *testing.T) {
	for _, addr := range []string{"0.0.0.0:3476", ":3476", "192.0.2.1:3476", "[::]:3476", "example.com:3476"} {
		_, stderr, code := run("serve", "--gpus", "sim:h100x8", "--listen", addr)
		if code != 2 || !strings.Contains(stderr, "not a loopback address") || !strings.Contains(stderr, "--allow-remote") {
			t.Errorf("--listen %s: exit %d, stderr %q", addr, code, stderr)
		}
	}
	_, stderr, code := run("serve", "--listen", "3476")
	if code != 2 || !strings.Contains(stderr, "HOST:PORT") {
		t.Errorf("--listen 3476: exit %d, stderr %q", code, stderr)
	}
	for _, addr := range []string{"127.0.0.1:3476", "localhost:3476", "[::1]:3476", "127.0.0.2:1"} {
		if err := checkListen(addr, false); err != nil {
			t.Errorf("checkListen(%s): %v", addr, err)
		}
	}

	// With --allow-remote it serves on every interface.
	root := fakeRoot(t)
	url, stop := startServe(t, "--gpus", "sim:h100x8", "--driver-root", root, "--listen", "0.0.0.0:0", "--allow-remote")
	port := url[strings.LastIndex(url, ":"):]
	resp, err := http.Get("http://127.0.0.1" + port + "/gpu/info/json")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Errorf("/gpu/info/json: %d", resp.StatusCode)
	}
	if code := stop(); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// The default address is both loopbacks: clients of localhost:3476 try
// [::1] first, and a port free there would let any local user answer them
// in Gantry's place.
func TestServeListensOnBothLoopbacks(t *testing.T) {
	if ln, err := net.Listen("tcp6", "[::1]:0"); err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	} else {
		ln.Close()
	}
	root := fakeRoot(t)
	url, stop := startServe(t, "--gpus", "sim:h100x8", "--driver-root", root, "--listen", "localhost:0")
	port := url[strings.LastIndex(url, ":"):]
	for _, host := range []string{"127.0.0.1", "[::1]"} {
		resp, err := http.Get("http://" + host + port + "/gpu/info/json")
		if err != nil {
			t.Errorf("%s%s: %v", host, port, err)
			continue
		}
		resp.Body.Close()
		if resp.StatusCode != 200 {
			t.Errorf("%s%s: %d", host, port, resp.StatusCode)
		}
	}
	if code := stop(); code != 0 {
		t.Errorf("exit %d", code)
	}
}

// Another program on [::1]'s port (a local user's impostor) stops serve
// from starting, naming the address, rather than serving 127.0.0.1 beside it.
func TestServeRefusesShadowedLoopback(t *testing.T) {
	ln, err := net.Listen("tcp6", "[::1]:0")
	if err != nil {
		t.Skipf("no IPv6 loopback here: %v", err)
	}
	defer ln.Close()
	port := strconv.Itoa(ln.Addr().(*net.TCPAddr).Port)
	if v4, err := net.Listen("tcp4", "127.0.0.1:"+port); err != nil {
		t.Skipf("127.0.0.1:%s is taken too: %v", port, err)
	} else {
		v4.Close()
	}
	root := fakeRoot(t)
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := Main([]string{"serve", "--gpus", "sim:h100x8", "--driver-root", root, "--listen", "localhost:" + port}, io.Discard, pw)
		pw.Close()
		done <- code
	}()
	var stderr string
	sc := bufio.NewScanner(pr)
	for sc.Scan() {
		stderr += sc.Text() + "\n"
		if strings.Contains(sc.Text(), "listening on http://") {
			// It serves beside the impostor: stop it, and fail.
			syscall.Kill(os.Getpid(), syscall.SIGTERM)
		}
	}
	code := <-done
	if code != 1 || !strings.Contains(stderr, "[::1]:"+port) || !strings.Contains(stderr, "another program holds the port on the IPv6 loopback") {
		t.Errorf("exit %d, stderr %q: want a refusal naming [::1]:%s", code, stderr, port)
	}
}
