package doctor

import (
	"net"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
)

// serveDockerInfo answers GET /info on a unix socket with body, as dockerd
// does; it returns the socket.
func serveDockerInfo(t *testing.T, body string) string {
	t.Helper()
	sock := filepath.Join(t.TempDir(), "docker.sock")
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/info" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "application/json")
		w.Write([]byte(body))
	})}
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return sock
}

// The CDI way (--device nvidia.com/gpu=all) is advised to a Docker user
// only where the running dockerd lists CDI spec dirs (Docker 25+ with the
// cdi feature); Debian's 20.10 answers /info without the field. (The real
// 20.10 is in test/engines, TestDoctorContainer.)
func TestDockerCDIAdvice(t *testing.T) {
	for _, tc := range []struct {
		name, info string
		cdi        bool
	}{
		{"docker 20.10", `{"ServerVersion":"20.10.24+dfsg1","Runtimes":{"runc":{"path":"runc"}}}`, false},
		{"docker 26, cdi off", `{"ServerVersion":"26.1.4","CDISpecDirs":[]}`, false},
		{"docker 27, cdi on", `{"ServerVersion":"27.3.1","CDISpecDirs":["/etc/cdi","/var/run/cdi"]}`, true},
		{"no dockerd", "", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			opts := Options{DockerSocket: filepath.Join(t.TempDir(), "none.sock")}
			if tc.info != "" {
				opts.DockerSocket = serveDockerInfo(t, tc.info)
			}
			opts.defaults()
			for _, f := range []string{
				fix(fixPlainRunc, "ORCDI", dockerCDIAdvice(opts, fix(fixOrCDI))),
				fix(fixRecurDocker, "ORCDI", dockerCDIAdvice(opts, fix(fixOrCDI))),
			} {
				if got := strings.Contains(f, "--device nvidia.com/gpu=all"); got != tc.cdi {
					t.Errorf("CDI advised %v, want %v: %s", got, tc.cdi, f)
				}
				if strings.Contains(f, "ORCDI") {
					t.Errorf("placeholder left: %s", f)
				}
			}
		})
	}
}
