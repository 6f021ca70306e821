package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"github.com/gantry-gpu/gantry/internal/drivervol"
)

// TestNVIDIADockerPlugin runs nvidia-docker-plugin with the original's
// flags: the REST API answers with the volume, and the plugin socket
// serves it, built at start.
func TestNVIDIADockerPlugin(t *testing.T) {
	root := fakeRoot(t)
	dir := t.TempDir()
	sockDir, volDir := filepath.Join(dir, "plugins"), filepath.Join(dir, "volumes")
	// The plugin makes the volume a read-only mount (as root): take it off.
	t.Cleanup(func() { drivervol.Store{Dir: filepath.Join(volDir, "nvidia_driver")}.Remove("580.159.04") })
	pr, pw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		code := NVIDIADockerPluginMain([]string{"-l", "127.0.0.1:0", "-s", sockDir, "-d=" + volDir,
			"--gpus", "sim:h100x8", "--driver-root", root}, io.Discard, pw)
		pw.Close()
		done <- code
	}()
	sc := bufio.NewScanner(pr)
	var url string
	for sc.Scan() {
		t.Logf("plugin: %s", sc.Text())
		if _, addr, ok := strings.Cut(sc.Text(), "listening on "); ok {
			url = addr
			break
		}
	}
	go io.Copy(io.Discard, pr)
	if url == "" {
		t.Fatalf("nvidia-docker-plugin did not start (exit %d)", <-done)
	}
	defer func() {
		syscall.Kill(os.Getpid(), syscall.SIGTERM)
		if code := <-done; code != 0 {
			t.Errorf("exit %d after SIGTERM", code)
		}
		if _, err := os.Stat(filepath.Join(sockDir, "nvidia-docker.sock")); err == nil {
			t.Error("the socket outlived the plugin")
		}
	}()

	resp, err := http.Get(url + "/docker/cli?dev=0")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	want := "--volume-driver=nvidia-docker --volume=nvidia_driver_580.159.04:/usr/local/nvidia:ro --device=" + root + "/dev/nvidiactl:/dev/nvidiactl"
	if !strings.HasPrefix(string(b), want) || !strings.HasSuffix(string(b), " --device="+root+"/dev/nvidia0:/dev/nvidia0") {
		t.Errorf("/docker/cli: %q\nwant %q...", b, want)
	}

	hc := &http.Client{Transport: &http.Transport{DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
		return (&net.Dialer{}).DialContext(ctx, "unix", filepath.Join(sockDir, "nvidia-docker.sock"))
	}}}
	req, _ := http.NewRequest("POST", "http://plugin/VolumeDriver.List", strings.NewReader("{}"))
	req.Header.Set("Accept", "application/vnd.docker.plugins.v1.2+json")
	resp, err = hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	var list struct {
		Volumes []struct{ Name, Mountpoint string }
	}
	json.NewDecoder(resp.Body).Decode(&list)
	resp.Body.Close()
	mp := filepath.Join(volDir, "nvidia_driver", "580.159.04")
	if len(list.Volumes) != 1 || list.Volumes[0].Name != "nvidia_driver_580.159.04" || list.Volumes[0].Mountpoint != mp {
		t.Errorf("List: %+v", list)
	}
	if _, err := os.Stat(filepath.Join(mp, "lib64", "libcuda.so.1")); err != nil {
		t.Error(err)
	}
}

func TestNVIDIADockerPluginFlags(t *testing.T) {
	var out, errOut strings.Builder
	if code := NVIDIADockerPluginMain([]string{"-v"}, &out, &errOut); code != 0 || !strings.HasPrefix(out.String(), "NVIDIA Docker plugin: ") {
		t.Errorf("-v: %d %q", code, out.String())
	}
	out.Reset()
	if code := NVIDIADockerPluginMain([]string{"-s"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "-s needs a value") {
		t.Errorf("-s: %d %q", code, errOut.String())
	}
	errOut.Reset()
	if code := NVIDIADockerPluginMain([]string{"-l", "0.0.0.0:3476", "--gpus", "sim:h100x8"}, &out, &errOut); code != 2 || !strings.Contains(errOut.String(), "--allow-remote") {
		t.Errorf("-l 0.0.0.0:3476: %d %q", code, errOut.String())
	}
}

// A plugin already running on the socket: the error names the flag
// nvidia-docker-plugin takes for the socket's directory (-s), not gantry
// serve's --plugin-dir.
func TestNVIDIADockerPluginAlreadyRunning(t *testing.T) {
	root := fakeRoot(t)
	dir := t.TempDir()
	sockDir, volDir := filepath.Join(dir, "plugins"), filepath.Join(dir, "volumes")
	t.Cleanup(func() { drivervol.Store{Dir: filepath.Join(volDir, "nvidia_driver")}.Remove("580.159.04") })
	if err := os.MkdirAll(sockDir, 0o700); err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("unix", filepath.Join(sockDir, "nvidia-docker.sock"))
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			c.Close()
		}
	}()
	var out, errOut strings.Builder
	code := NVIDIADockerPluginMain([]string{"-l", "127.0.0.1:0", "-s", sockDir, "-d", volDir, "--gpus", "sim:h100x8", "--driver-root", root}, &out, &errOut)
	if code == 0 || !strings.Contains(errOut.String(), "another plugin listens there") || !strings.Contains(errOut.String(), "give another -s") || strings.Contains(errOut.String(), "--plugin-dir") {
		t.Errorf("exit %d, stderr %q; want an error naming -s", code, errOut.String())
	}
}
