package legacyapi

import (
	"flag"
	"fmt"
	"math"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/gantry-gpu/gantry/internal/fakedriver"
	"github.com/gantry-gpu/gantry/internal/gpu"
	"github.com/gantry-gpu/gantry/internal/gpu/readings"
)

var update = flag.Bool("update", false, "rewrite the golden files in testdata/")

// golden compares got with testdata/name, or rewrites it with -update.
func golden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll("testdata", 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test ./internal/legacyapi -update to write it)", err)
	}
	if got != string(want) {
		t.Errorf("%s differs from %s (go test -update rewrites it after a deliberate change):\n%s", name, path, got)
	}
}

// nullMatches reports whether a JSON value is null exactly when the reading is unknown.
func nullMatches[T uint | uint64](p *T, reading float64) bool {
	return (p == nil) == math.IsNaN(reading)
}

// wholeIs reports whether p holds reading cut down to a whole number (the
// original divided integers).
func wholeIs[T uint | uint64](p *T, reading float64) bool {
	if p == nil {
		return math.IsNaN(reading)
	}
	return !math.IsNaN(reading) && uint64(*p) == uint64(reading)
}

// statusText splits /gpu/status's text into one map per device, from each
// row's label (with its indentation, and the headings above it for rows
// whose label repeats, such as "Memory") to its value.
func statusText(t *testing.T, text string) []map[string]string {
	t.Helper()
	var devs []map[string]string
	var cur map[string]string
	heading := map[int]string{} // indentation -> the last heading there
	for _, line := range strings.Split(strings.TrimSuffix(text, "\n"), "\n") {
		if strings.HasPrefix(line, "Device #") {
			cur = map[string]string{}
			devs = append(devs, cur)
			continue
		}
		if line == "" || cur == nil {
			continue
		}
		indent := len(line) - len(strings.TrimLeft(line, " "))
		label, value, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok { // a heading; the deeper ones end with it
			heading[indent] = label
			for i := indent + 2; i <= 8; i += 2 {
				delete(heading, i)
			}
			continue
		}
		if strings.HasPrefix(label, "- ") { // a process: its rows are under Processes
			heading[indent] = ""
		}
		key := label
		for i := indent - 2; i >= 2; i -= 2 {
			if heading[i] != "" {
				key = heading[i] + "/" + key
			}
		}
		for n := 2; ; n++ { // processes repeat their rows
			if _, dup := cur[key]; !dup {
				break
			}
			key = fmt.Sprintf("%s#%d", strings.Split(key, "#")[0], n)
		}
		cur[key] = strings.TrimSpace(value)
	}
	return devs
}

// checkAligned checks the text's layout: in each run of "Label:  value"
// rows (a heading or blank line ends a run), the values start two spaces
// after the run's longest label, as the original's tabwriter put them.
func checkAligned(t *testing.T, text string) {
	t.Helper()
	var run []string
	end := func() {
		width := 0
		for _, l := range run {
			width = max(width, strings.Index(l, ":")+1)
		}
		for _, l := range run {
			if rest := l[width:]; !strings.HasPrefix(rest, "  ") || strings.HasPrefix(rest, "   ") {
				t.Errorf("row %q: value not two spaces after the longest label of its run (%d)", l, width)
			}
		}
		run = nil
	}
	rowRE := regexp.MustCompile(`^ *[^ :][^:]*: +\S`)
	for _, l := range strings.Split(text, "\n") {
		if rowRE.MatchString(l) && !strings.HasSuffix(strings.TrimSpace(l), ":") {
			run = append(run, l)
		} else {
			end()
		}
	}
	end()
}

func TestGPUStatus(t *testing.T) {
	var idle, busy int
	for _, profile := range []string{"h100x8", "a100x2-mig", "l40sx8"} {
		t.Run(profile, func(t *testing.T) {
			f := newFixtureGPUs(t, fakedriver.LayoutStandard, "sim:"+profile)
			reader := readings.NewSim(f.sys)
			var st Status
			getJSON(t, f.url+"/gpu/status/json", &st)
			var info Info
			getJSON(t, f.url+"/gpu/info/json", &info)
			if len(st.Devices) != len(f.sys.Devices) || len(info.Devices) != len(f.sys.Devices) {
				t.Fatalf("%d/%d devices, want %d", len(st.Devices), len(info.Devices), len(f.sys.Devices))
			}
			_, text, h := get(t, f.url+"/gpu/status")
			if !strings.HasPrefix(h.Get("Content-Type"), "text/plain") {
				t.Errorf("Content-Type %q", h.Get("Content-Type"))
			}
			rows := statusText(t, text)
			if len(rows) != len(f.sys.Devices) {
				t.Fatalf("text has %d devices:\n%s", len(rows), text)
			}
			for i, d := range st.Devices {
				s, err := reader.Read(f.sys.Devices[i].UUID)
				if err != nil {
					t.Fatal(err)
				}
				di := info.Devices[i]
				// JSON, field by field, in the original's units.
				for name, ok := range map[string]bool{
					"Power":                 wholeIs(d.Power, s.PowerWatts),
					"Temperature":           wholeIs(d.Temperature, s.TemperatureCelsius),
					"Utilization.GPU":       wholeIs(d.Utilization.GPU, s.UtilizationPercent),
					"Utilization.Memory":    wholeIs(d.Utilization.Memory, s.MemoryUtilizationPercent),
					"Utilization.Encoder":   wholeIs(d.Utilization.Encoder, s.EncoderUtilizationPercent),
					"Utilization.Decoder":   wholeIs(d.Utilization.Decoder, s.DecoderUtilizationPercent),
					"Memory.GlobalUsed":     wholeIs(d.Memory.GlobalUsed, s.MemoryUsedBytes/(1<<20)),
					"ECCErrors.L1Cache":     wholeIs(d.Memory.ECCErrors.L1Cache, s.ECCErrorsL1Cache),
					"ECCErrors.L2Cache":     wholeIs(d.Memory.ECCErrors.L2Cache, s.ECCErrorsL2Cache),
					"ECCErrors.Global":      wholeIs(d.Memory.ECCErrors.Global, s.ECCErrorsDeviceMemory),
					"Clocks.Cores":          wholeIs(d.Clocks.Cores, s.SMClockMHz),
					"Clocks.Memory":         wholeIs(d.Clocks.Memory, s.MemoryClockMHz),
					"PCI.BAR1Used":          wholeIs(d.PCI.BAR1Used, s.BAR1UsedBytes/(1<<20)),
					"PCI.Throughput.RX":     wholeIs(d.PCI.Throughput.RX, s.PCIeRXBytesPerSecond/1e6),
					"PCI.Throughput.TX":     wholeIs(d.PCI.Throughput.TX, s.PCIeTXBytesPerSecond/1e6),
					"info Power":            wholeIs(di.Power, s.PowerLimitWatts),
					"info PCI.BAR1":         wholeIs(di.PCI.BAR1, s.BAR1TotalBytes/(1<<20)),
					"info Clocks.Cores":     wholeIs(di.Clocks.Cores, s.MaxSMClockMHz),
					"info Clocks.Memory":    wholeIs(di.Clocks.Memory, s.MaxMemoryClockMHz),
					"null iff unknown: GPU": nullMatches(d.Utilization.GPU, s.UtilizationPercent),
				} {
					if !ok {
						t.Errorf("GPU %d: %s wrong: %+v from %+v", i, name, d, s)
					}
				}
				if len(d.Processes) != len(s.Processes) {
					t.Fatalf("GPU %d: processes %+v, want %+v", i, d.Processes, s.Processes)
				}
				for j, p := range d.Processes {
					want := s.Processes[j]
					if p.PID != uint(want.PID) || p.Name != want.Name || !wholeIs(p.MemoryUsed, want.UsedMemoryBytes/(1<<20)) {
						t.Errorf("GPU %d: process %+v, want %+v", i, p, want)
					}
				}
				if len(s.Processes) == 0 {
					idle++
				} else {
					busy++
				}

				// The text says the same, with the original's units and N/A.
				r := rows[i]
				orNA := func(p *uint, unit string) string {
					if p == nil {
						return "N/A"
					}
					return fmt.Sprint(*p) + unit
				}
				orNA64 := func(p *uint64, unit string) string {
					if p == nil {
						return "N/A"
					}
					return fmt.Sprint(*p) + unit
				}
				want := map[string]string{
					"Power":                      fmt.Sprintf("%d / %d W", *d.Power, *di.Power),
					"Temperature":                orNA(d.Temperature, " °C"),
					"Utilization/GPU":            orNA(d.Utilization.GPU, " %"),
					"Utilization/Memory":         orNA(d.Utilization.Memory, " %"),
					"Utilization/Encoder":        orNA(d.Utilization.Encoder, " %"),
					"Utilization/Decoder":        orNA(d.Utilization.Decoder, " %"),
					"Memory/Global":              fmt.Sprintf("%d / %d MiB", *d.Memory.GlobalUsed, f.sys.Devices[i].MemoryMiB),
					"Memory/ECC Errors/L1 Cache": orNA64(d.Memory.ECCErrors.L1Cache, ""),
					"Memory/ECC Errors/L2 Cache": orNA64(d.Memory.ECCErrors.L2Cache, ""),
					"Memory/ECC Errors/Global":   orNA64(d.Memory.ECCErrors.Global, ""),
					"PCI/BAR1":                   fmt.Sprintf("%d / %d MiB", *d.PCI.BAR1Used, *di.PCI.BAR1),
					"PCI/Throughput/RX":          orNA(d.PCI.Throughput.RX, " MB/s"),
					"PCI/Throughput/TX":          orNA(d.PCI.Throughput.TX, " MB/s"),
					"Clocks/Cores":               orNA(d.Clocks.Cores, " MHz"),
					"Clocks/Memory":              orNA(d.Clocks.Memory, " MHz"),
				}
				if len(d.Processes) == 0 {
					want["Processes"] = "None"
				}
				for j, p := range d.Processes {
					suffix := ""
					if j > 0 {
						suffix = fmt.Sprintf("#%d", j+1)
					}
					want["Processes/- PID"+suffix] = fmt.Sprint(p.PID)
					want["Processes/Name"+suffix] = p.Name
					want["Processes/Memory"+suffix] = orNA64(p.MemoryUsed, " MiB")
				}
				for k, v := range want {
					if r[k] != v {
						t.Errorf("GPU %d text: %s is %q, want %q", i, k, r[k], v)
					}
				}
				if len(r) != len(want) {
					t.Errorf("GPU %d text: %d rows, want %d: %v", i, len(r), len(want), r)
				}
			}
			if !strings.HasPrefix(text, "\nDevice #0\n") || !strings.HasSuffix(text, "\n\n") {
				t.Errorf("text does not start with a blank line and Device #0, or end with a blank line:\n%q", text)
			}
			checkAligned(t, text)

			// The exact bytes, to catch any change of shape: key order and
			// nulls in the JSON, layout in the text.
			_, raw, _ := get(t, f.url+"/v1.0/gpu/status/json")
			golden(t, "gpu-status-"+profile+".json", raw)
			golden(t, "gpu-status-"+profile+".txt", text)
		})
	}
	if idle == 0 || busy == 0 {
		t.Errorf("%d idle and %d busy GPUs: the profiles should show both", idle, busy)
	}
}

// The MIG-enabled A100s have no utilisation and no volatile ECC counts:
// null in JSON, N/A in the text, and nothing else is lost with them.
func TestGPUStatusMIGNulls(t *testing.T) {
	f := newFixtureGPUs(t, fakedriver.LayoutStandard, "sim:a100x2-mig")
	_, raw, _ := get(t, f.url+"/gpu/status/json")
	for _, want := range []string{
		`"Utilization":{"GPU":null,"Memory":null,"Encoder":null,"Decoder":null}`,
		`"ECCErrors":{"L1Cache":null,"L2Cache":null,"Global":null}`,
	} {
		if strings.Count(raw, want) != 2 || strings.Contains(raw, `"Clocks":{"Cores":null`) {
			t.Errorf("/gpu/status/json has not twice %s:\n%s", want, raw)
		}
	}
	_, text, _ := get(t, f.url+"/gpu/status")
	if n := strings.Count(text, "N/A\n"); n != 2*7 {
		t.Errorf("%d N/A values, want 7 per GPU:\n%s", n, text)
	}
}

// A GPU that cannot be read, or a server with no Reader, shows every
// reading null / N/A; the other GPUs are still read.
func TestGPUStatusUnreadable(t *testing.T) {
	f := newFixture(t, fakedriver.LayoutStandard)
	partial := &gpu.System{Devices: f.sys.Devices[1:]} // knows nothing of GPU 0
	for name, reader := range map[string]Reader{"one GPU unreadable": readings.NewSim(partial), "no reader": nil} {
		t.Run(name, func(t *testing.T) {
			ts := httptest.NewServer(New(Options{System: f.sys, Driver: f.inv, Reader: reader}))
			defer ts.Close()
			code, raw, _ := get(t, ts.URL+"/gpu/status/json")
			if code != 200 {
				t.Fatalf("%d %s", code, raw)
			}
			allNull := `{"Power":null,"Temperature":null,"Utilization":{"GPU":null,"Memory":null,"Encoder":null,"Decoder":null},` +
				`"Memory":{"GlobalUsed":null,"ECCErrors":{"L1Cache":null,"L2Cache":null,"Global":null}},"Clocks":{"Cores":null,"Memory":null},` +
				`"PCI":{"BAR1Used":null,"Throughput":{"RX":null,"TX":null}},"Processes":null}`
			if !strings.HasPrefix(raw, `{"Devices":[`+allNull+",") {
				t.Errorf("GPU 0 is not all null:\n%.600s", raw)
			}
			wantNull := 8
			if reader != nil {
				wantNull = 1
			}
			if n := strings.Count(raw, allNull); n != wantNull {
				t.Errorf("%d GPUs all null, want %d", n, wantNull)
			}
			_, text, _ := get(t, ts.URL+"/gpu/status")
			dev0 := statusText(t, text)[0]
			for k, v := range dev0 {
				if want := "N/A"; k == "Processes" && v != "None" || k != "Processes" && v != want {
					t.Errorf("GPU 0 text: %s = %q", k, v)
				}
			}
		})
	}
}

// hostileNames is the simulator's readings with every process named as a
// real process on this host is: one whose argv[0] a container chose.
type hostileNames struct {
	Reader
	pid uint32
}

func (h hostileNames) Read(uuid string) (readings.Sample, error) {
	s, err := h.Reader.Read(uuid)
	for i := range s.Processes {
		s.Processes[i].Name = readings.ProcessName("/proc", h.pid)
	}
	return s, err
}

// A process name with a newline (argv[0] is the process's to choose, and
// a container's processes show up here) stays on its row of the text: it
// cannot forge a device or a reading.
func TestGPUStatusProcessNameCannotForgeRows(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Skipf("no sleep program: %v", err)
	}
	cmd := exec.Command(sleep, "60")
	cmd.Args[0] = "job\n\nDevice #99\n  Power:  1 / 1 W\x1b[2J"
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { cmd.Process.Kill(); cmd.Wait() }()
	f := newFixtureGPUs(t, fakedriver.LayoutStandard, "sim:h100x8")
	r := hostileNames{Reader: readings.NewSim(f.sys), pid: uint32(cmd.Process.Pid)}
	if n := readings.ProcessName("/proc", r.pid); !strings.Contains(n, "\n") {
		t.Fatalf("the process's name %q lost its newline before the test", n)
	}
	ts := httptest.NewServer(New(Options{System: f.sys, Driver: f.inv, Reader: r}))
	defer ts.Close()
	_, text, _ := get(t, ts.URL+"/gpu/status")
	if regexp.MustCompile(`(?m)^Device #99`).MatchString(text) {
		t.Fatalf("a process name forged a device:\n%s", text)
	}
	if strings.Contains(text, "\x1b") {
		t.Errorf("a control character reached the text: %q", text)
	}
	if got := len(statusText(t, text)); got != len(f.sys.Devices) {
		t.Errorf("%d devices in the text, want %d:\n%s", got, len(f.sys.Devices), text)
	}
	if !strings.Contains(text, "job??Device #99?  Power:  1 / 1 W?[2J") {
		t.Errorf("the name is not on its row with its control characters shown as '?':\n%s", text)
	}
}
