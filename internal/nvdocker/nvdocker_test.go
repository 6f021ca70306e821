package nvdocker

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestRewrite(t *testing.T) {
	const sel = "--runtime=nvidia -e NVIDIA_VISIBLE_DEVICES="
	for _, tc := range []struct {
		args, gpus, want string
	}{
		{"run --rm cuda nvidia-smi", "0,1", "run " + sel + "0,1 --rm cuda nvidia-smi"},
		{"run cuda", "", "run " + sel + "all cuda"},
		{"run cuda", " 0  2 ", "run " + sel + "0,2 cuda"},
		{"run cuda", "GPU-1234, GPU-5678", "run " + sel + "GPU-1234,GPU-5678 cuda"},
		{"create -it cuda bash", "3", "create " + sel + "3 -it cuda bash"},
		{"container run cuda", "1", "container run " + sel + "1 cuda"},
		{"container create cuda", "1", "container create " + sel + "1 cuda"},
		// Global options before the command, with and without values.
		{"-H tcp://h:2375 --debug run cuda", "0", "-H tcp://h:2375 --debug run " + sel + "0 cuda"},
		{"--config run run cuda", "0", "--config run run " + sel + "0 cuda"},
		{"--context=remote run cuda", "0", "--context=remote run " + sel + "0 cuda"},
		// Everything else passes unchanged, also a "run" later on the line.
		{"ps -a", "0", "ps -a"},
		{"exec -it c1 run", "0", "exec -it c1 run"},
		{"container ls", "0", "container ls"},
		{"container", "0", "container"},
		{"image pull run", "0", "image pull run"},
		{"images", "0", "images"},
		{"version", "0", "version"},
		{"", "0", ""},
		{"--help", "0", "--help"},
		{"-- run cuda", "0", "-- run cuda"},
	} {
		got := strings.Join(Rewrite(strings.Fields(tc.args), tc.gpus), " ")
		if got != tc.want {
			t.Errorf("Rewrite(%q, NV_GPU=%q)\n got %q\nwant %q", tc.args, tc.gpus, got, tc.want)
		}
	}
}

// fakeDocker writes a docker script that records its argv, one word a line,
// and exits with the status in $FAKE_DOCKER_EXIT.
func fakeDocker(t *testing.T, dir, name string) string {
	t.Helper()
	script := `#!/bin/sh
for a in "$@"; do printf '%s\n' "$a"; done > "$FAKE_DOCKER_LOG"
echo "$0" > "$FAKE_DOCKER_LOG.argv0"
cat > "$FAKE_DOCKER_LOG.stdin"
echo docker-says-hello
exit ${FAKE_DOCKER_EXIT:-0}
`
	p := filepath.Join(dir, name)
	if err := os.WriteFile(p, []byte(script), 0o755); err != nil {
		t.Fatal(err)
	}
	return p
}

func readLines(t *testing.T, p string) []string {
	t.Helper()
	b, err := os.ReadFile(p)
	if err != nil {
		t.Fatal(err)
	}
	return strings.Split(strings.TrimSuffix(string(b), "\n"), "\n")
}

func TestMainExecsDocker(t *testing.T) {
	bin := t.TempDir()
	fakeDocker(t, bin, "docker")
	log := filepath.Join(t.TempDir(), "argv")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_DOCKER_LOG", log)
	t.Setenv("NV_DOCKER", "")

	for _, tc := range []struct {
		name, gpus, exit string
		args             []string
		want             []string
		code             int
	}{
		{"run", "0,1", "0", []string{"run", "--rm", "cuda", "sh", "-c", "nvidia-smi -L"},
			[]string{"run", "--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=0,1", "--rm", "cuda", "sh", "-c", "nvidia-smi -L"}, 0},
		{"run all", "", "0", []string{"container", "run", "cuda"},
			[]string{"container", "run", "--runtime=nvidia", "-e", "NVIDIA_VISIBLE_DEVICES=all", "cuda"}, 0},
		{"passthrough", "0", "3", []string{"ps", "--format", "{{.ID}} x"},
			[]string{"ps", "--format", "{{.ID}} x"}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Setenv("NV_GPU", tc.gpus)
			t.Setenv("FAKE_DOCKER_EXIT", tc.exit)
			var out, errb bytes.Buffer
			code := Main(tc.args, strings.NewReader("input-for-docker"), &out, &errb)
			if code != tc.code {
				t.Fatalf("exit %d, want %d; stderr %q", code, tc.code, errb.String())
			}
			if got := readLines(t, log); strings.Join(got, "\x00") != strings.Join(tc.want, "\x00") {
				t.Errorf("docker argv %q\nwant %q", got, tc.want)
			}
			if out.String() != "docker-says-hello\n" {
				t.Errorf("stdout %q", out.String())
			}
			if got := readLines(t, log+".stdin"); got[0] != "input-for-docker" {
				t.Errorf("docker's stdin %q", got)
			}
		})
	}
}

func TestMainNVDocker(t *testing.T) {
	dir := t.TempDir()
	p := fakeDocker(t, dir, "my-docker")
	log := filepath.Join(t.TempDir(), "argv")
	t.Setenv("FAKE_DOCKER_LOG", log)
	t.Setenv("FAKE_DOCKER_EXIT", "0")
	t.Setenv("NV_GPU", "2")
	// NV_DOCKER is split on white space: a command with its own options.
	t.Setenv("NV_DOCKER", p+" --config /etc/ci-docker")
	var out, errb bytes.Buffer
	if code := Main([]string{"version"}, strings.NewReader(""), &out, &errb); code != 0 {
		t.Fatalf("exit %d: %s", code, errb.String())
	}
	if got, want := readLines(t, log), []string{"--config", "/etc/ci-docker", "version"}; strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("argv %q, want %q", got, want)
	}
	if !strings.HasPrefix(out.String(), "NVIDIA Docker: ") || !strings.HasSuffix(out.String(), "\ndocker-says-hello\n") {
		t.Errorf("version output %q", out.String())
	}
	if got := readLines(t, log+".argv0"); got[0] != p {
		t.Errorf("argv0 %q, want %q", got[0], p)
	}

	t.Setenv("NV_DOCKER", filepath.Join(dir, "missing-docker"))
	errb.Reset()
	if code := Main([]string{"ps"}, strings.NewReader(""), &out, &errb); code != 1 || !strings.Contains(errb.String(), "NV_DOCKER") {
		t.Errorf("missing docker: exit %d, stderr %q", code, errb.String())
	}
}

// nvidia-docker --help says what the wrapper reads (NV_GPU, NV_DOCKER),
// then docker's own help follows; a help of a command (run --help) is
// docker's alone.
func TestHelp(t *testing.T) {
	bin := t.TempDir()
	fakeDocker(t, bin, "docker")
	log := filepath.Join(t.TempDir(), "argv")
	t.Setenv("PATH", bin+string(os.PathListSeparator)+os.Getenv("PATH"))
	t.Setenv("FAKE_DOCKER_LOG", log)
	t.Setenv("FAKE_DOCKER_EXIT", "0")
	t.Setenv("NV_DOCKER", "")
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"--debug", "--help"}} {
		var out, errb bytes.Buffer
		if code := Main(args, strings.NewReader(""), &out, &errb); code != 0 {
			t.Fatalf("%q: exit %d: %s", args, code, errb.String())
		}
		for _, want := range []string{"NV_GPU", "NV_DOCKER", "docker-says-hello"} {
			if !strings.Contains(out.String(), want) {
				t.Errorf("nvidia-docker %q: output %q lacks %s", args, out.String(), want)
			}
		}
		if got := readLines(t, log); strings.Join(got, " ") != strings.Join(args, " ") {
			t.Errorf("docker argv %q, want %q", got, args)
		}
	}
	var out bytes.Buffer
	Main([]string{"run", "--help"}, strings.NewReader(""), &out, io.Discard)
	if strings.Contains(out.String(), "NV_GPU") {
		t.Errorf("run --help: %q", out.String())
	}
}
