// Package docs tests the documentation against the programs it documents,
// so the docs cannot rot. Every command line of a ```sh block of
// docs/*.md and README.md (and every "$ " line of a transcript block) is
// either run here or accounted for (TestEveryCommandRunOrMapped):
//
//   - blocks preceded by "<!-- doctest -->" are run, in order, with bash in a
//     sandbox (simulated GPUs, a fake driver root, temporary HOME and
//     TMPDIR; see sandbox_test.go) and must exit 0; in a transcript block (no
//     language, "$ " lines followed by their output) each command's output
//     must match, a line "..." standing for any number of lines;
//   - blocks preceded by "<!-- doctest: root -->" write system paths (sudo
//     make install, /etc/docker/daemon.json, /var/run/cdi) or use fixed
//     ports and /tmp paths: they run as root in a private mount and network
//     namespace whose /etc, /usr/bin, /var, /run and /tmp are scratch, so the
//     docs' exact lines run and nothing reaches the host;
//   - blocks preceded by "<!-- doctest: root, driver -->" run the same way
//     with a loaded NVIDIA driver simulated for them alone (its majors in
//     /proc/devices, MIG capabilities in /proc/driver, GPUs on the PCI bus,
//     modprobe, and a scratch /dev; sandbox.withDriverHost);
//   - a line that needs a daemon, a cluster or a GPU (docker run, ctr,
//     podman, kubectl, helm install, systemctl) is listed in notRun
//     (notrun_test.go) with the Go tests of this repository that run its
//     equivalent against the real engine, which must exist, or, for the few
//     nothing here can run, why; in a doctest block such a line is left out
//     of the run. A line neither run nor listed fails the test, and so does
//     an entry no line matches;
//   - every command line that runs one of our programs is also checked
//     against the program built from this tree: the subcommand exists and
//     every flag on the line is in that command's --help; make targets exist
//     in the Makefile; scripts/*.sh and bench/*.sh exist and are executable;
//   - troubleshooting.md is generated from internal/doctor's Checks:
//     go generate ./internal/doctor rewrites it, and the test fails when it
//     is stale.
package docs

import (
	"bytes"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"

	"github.com/gantry-gpu/gantry/internal/doctor"
)

// binDir holds gantry, gantry-runtime, gantry-device-plugin, gantry-dra-plugin,
// gantry-cdi-hook and bundlesplit (make bundlesplit), built from this tree by TestMain, and
// the names make install links to them.
var binDir string

const repoRoot = ".."

// installedNames are the names make install links to each binary (both
// dispatch on argv0).
var installedNames = map[string][]string{
	"gantry-runtime":  {"gantry-hook", "nvidia-container-runtime", "nvidia-container-runtime-hook", "nvidia-container-toolkit", "nvidia-container-cli", "nvidia-ctk"},
	"gantry":          {"nvidia-docker", "nvidia-docker-plugin"},
	"gantry-cdi-hook": {"nvidia-cdi-hook"},
}

func TestMain(m *testing.M) {
	flag.Parse()
	dir, err := os.MkdirTemp("", "gantry-docs-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binDir = filepath.Join(dir, "bin")
	code := func() int {
		defer os.RemoveAll(dir)
		for _, pkg := range []string{"cmd/gantry", "cmd/gantry-runtime", "cmd/gantry-device-plugin", "cmd/gantry-dra-plugin", "cmd/gantry-cdi-hook", "bench/bundlesplit"} {
			pkg, dir := filepath.Base(pkg), filepath.Dir(pkg)
			cmd := exec.Command("go", "build", "-o", filepath.Join(binDir, pkg), "./"+dir+"/"+pkg)
			cmd.Dir = repoRoot
			cmd.Env = append(os.Environ(), "CGO_CFLAGS=-O2 -g -Wno-deprecated-declarations")
			if pkg == "gantry-cdi-hook" {
				cmd.Env = append(cmd.Env, "CGO_ENABLED=0") // as make build builds it
			}
			if out, err := cmd.CombinedOutput(); err != nil {
				fmt.Fprintf(os.Stderr, "go build ./%s/%s: %v\n%s", dir, pkg, err, out)
				return 1
			}
		}
		for target, names := range installedNames {
			for _, n := range names {
				if err := os.Symlink(target, filepath.Join(binDir, n)); err != nil {
					fmt.Fprintln(os.Stderr, err)
					return 1
				}
			}
		}
		return m.Run()
	}()
	os.Exit(code)
}

var trackOnce sync.Once

// trackSources reads every Go file, script, manifest and the Makefile of
// the tree. go test caches a passing run by the files the test opened (once
// testing has started, so not in TestMain); the binaries are built from the
// whole tree, so a change anywhere must invalidate the cached result.
func trackSources() {
	trackOnce.Do(func() {
		filepath.WalkDir(repoRoot, func(p string, d os.DirEntry, err error) error {
			if err != nil || (d.IsDir() && p != repoRoot && strings.HasPrefix(d.Name(), ".")) {
				return filepath.SkipDir
			}
			if !d.IsDir() && (strings.HasSuffix(p, ".go") || strings.HasSuffix(p, ".sh") ||
				strings.HasSuffix(p, ".yaml") || strings.HasSuffix(p, ".c") || d.Name() == "Makefile") {
				os.ReadFile(p)
			}
			return nil
		})
	})
}

// block is one fenced code block of a markdown file.
type block struct {
	file    string // relative to the repository root
	line    int    // of the opening fence
	lang    string
	text    string
	doctest bool // preceded by <!-- doctest --> or <!-- doctest: root -->
	root    bool // <!-- doctest: root -->: runs in the private namespace
	// driver: <!-- doctest: root, driver -->: runs in the private namespace
	// with a loaded NVIDIA driver simulated (sandbox.withDriverHost).
	driver bool
}

func (b block) where() string { return fmt.Sprintf("%s:%d", b.file, b.line) }

// docFiles are the markdown files the tests read, relative to the repository root.
func docFiles(t *testing.T) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(repoRoot, "docs", "*.md"))
	if err != nil {
		t.Fatal(err)
	}
	out := []string{"README.md"}
	for _, f := range files {
		out = append(out, filepath.Join("docs", filepath.Base(f)))
	}
	return out
}

var fenceRe = regexp.MustCompile("^```\\s*([A-Za-z0-9_+-]*)\\s*$")

const (
	doctestMarker       = "<!-- doctest -->"
	rootDoctestMarker   = "<!-- doctest: root -->"
	driverDoctestMarker = "<!-- doctest: root, driver -->"
)

// readBlocks returns the fenced blocks of a markdown file. A block is a
// doctest when the last non-blank line before its fence is a doctest marker.
func readBlocks(t *testing.T, file string) []block {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, file))
	if err != nil {
		t.Fatal(err)
	}
	var blocks []block
	var cur *block
	var body []string
	lastNonBlank := ""
	for i, line := range strings.Split(string(b), "\n") {
		if cur != nil {
			if strings.TrimSpace(line) == "```" {
				cur.text = strings.Join(body, "\n") + "\n"
				blocks = append(blocks, *cur)
				cur, body = nil, nil
				lastNonBlank = ""
				continue
			}
			body = append(body, line)
			continue
		}
		if m := fenceRe.FindStringSubmatch(line); m != nil {
			cur = &block{file: file, line: i + 1, lang: m[1],
				doctest: lastNonBlank == doctestMarker || lastNonBlank == rootDoctestMarker || lastNonBlank == driverDoctestMarker,
				root:    lastNonBlank == rootDoctestMarker || lastNonBlank == driverDoctestMarker,
				driver:  lastNonBlank == driverDoctestMarker}
			continue
		}
		if strings.TrimSpace(line) != "" {
			lastNonBlank = strings.TrimSpace(line)
		}
	}
	if cur != nil {
		t.Fatalf("%s: unterminated code block", cur.where())
	}
	return blocks
}

func isShell(lang string) bool { return lang == "sh" || lang == "bash" || lang == "shell" }

// isTranscript: a block without a language whose first line is a "$ " command.
func isTranscript(b block) bool {
	return b.lang == "" && strings.HasPrefix(b.text, "$ ")
}

// cmdLine is one shell command line of a block: continuation lines joined,
// a here-document's body left out (it is data, not commands).
type cmdLine struct {
	text        string
	at          int // line number in the markdown file
	first, last int // its lines in the block's text, 0-based
}

var heredocRe = regexp.MustCompile(`<<(-?)\s*(['"]?)([A-Za-z_][A-Za-z0-9_]*)['"]?`)

// commandLines returns the shell command lines of a block.
func commandLines(b block) []cmdLine {
	var lines []cmdLine
	raw := strings.Split(strings.TrimSuffix(b.text, "\n"), "\n")
	transcript := isTranscript(b)
	for i := 0; i < len(raw); i++ {
		line := raw[i]
		if transcript {
			c, ok := strings.CutPrefix(line, "$ ")
			if !ok {
				continue
			}
			line = c
		}
		first := i
		for strings.HasSuffix(line, "\\") && i+1 < len(raw) {
			i++
			line = strings.TrimSuffix(line, "\\") + " " + strings.TrimSpace(raw[i])
		}
		if strings.TrimSpace(line) == "" {
			continue
		}
		lines = append(lines, cmdLine{text: line, at: b.line + 1 + first, first: first, last: i})
		if m := heredocRe.FindStringSubmatch(line); m != nil && !strings.Contains(line, "<<<") {
			for i+1 < len(raw) && strings.TrimSpace(raw[i+1]) != m[3] {
				i++
			}
			i++ // the delimiter
		}
	}
	return lines
}

// displayLine is a command line as notRun's patterns see it: without its
// comment, white space runs as one space.
func displayLine(line string) string {
	inSingle, inDouble := false, false
	for i, c := range line {
		switch {
		case c == '\'' && !inDouble:
			inSingle = !inSingle
		case c == '"' && !inSingle:
			inDouble = !inDouble
		case c == '#' && !inSingle && !inDouble && (i == 0 || line[i-1] == ' ' || line[i-1] == '\t'):
			return norm(line[:i])
		}
	}
	return norm(line)
}

// splitCommands splits a shell line into simple commands, each a list of
// words: quotes are removed, comments dropped, redirections and their
// targets left out, and |, ||, &&, ;, & and parentheses separate commands.
// $(...) stays inside its word. Enough shell for documentation lines.
func splitCommands(line string) [][]string {
	var cmds [][]string
	var words []string
	var w strings.Builder
	inWord, skipNext := false, false
	endWord := func() {
		if !inWord {
			return
		}
		if skipNext {
			skipNext = false
		} else {
			words = append(words, w.String())
		}
		w.Reset()
		inWord = false
	}
	endCmd := func() {
		endWord()
		if len(words) > 0 {
			cmds = append(cmds, words)
		}
		words = nil
	}
	r := []rune(line)
	for i := 0; i < len(r); i++ {
		c := r[i]
		switch {
		case c == '\'':
			inWord = true
			j := i + 1
			for j < len(r) && r[j] != '\'' {
				j++
			}
			w.WriteString(string(r[i+1 : min(j, len(r))]))
			i = j
		case c == '"':
			inWord = true
			j := i + 1
			for j < len(r) && r[j] != '"' {
				if r[j] == '\\' && j+1 < len(r) {
					j++
				}
				w.WriteRune(r[j])
				j++
			}
			i = j
		case c == '\\' && i+1 < len(r):
			inWord = true
			i++
			w.WriteRune(r[i])
		case c == '$' && i+1 < len(r) && r[i+1] == '(':
			inWord = true
			depth := 0
			j := i
			for ; j < len(r); j++ {
				w.WriteRune(r[j])
				if r[j] == '(' {
					depth++
				} else if r[j] == ')' {
					depth--
					if depth == 0 {
						break
					}
				}
			}
			i = j
		case c == '#' && !inWord:
			endCmd()
			return cmds
		case c == ' ' || c == '\t':
			endWord()
		case c == '|' || c == ';' || c == '(' || c == ')':
			endCmd()
		case c == '&':
			if i+1 < len(r) && r[i+1] == '>' { // &> file
				endWord()
				i++
				skipNext = true
				continue
			}
			endCmd()
		case c == '>' || c == '<':
			// a redirection: drop a leading fd number, the operator and its target
			if inWord && regexp.MustCompile(`^[0-9]+$`).MatchString(w.String()) {
				w.Reset()
				inWord = false
			}
			endWord()
			for i+1 < len(r) && (r[i+1] == '>' || r[i+1] == '&') {
				i++
			}
			if i+1 < len(r) && r[i] == '&' && r[i+1] >= '0' && r[i+1] <= '9' { // 2>&1
				i++
				continue
			}
			skipNext = true
		default:
			inWord = true
			w.WriteRune(c)
		}
	}
	endCmd()
	return cmds
}

var envAssign = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*=`)

// program strips what runs a command without being it (VAR=value, sudo,
// env, time, exec) and returns the program and its arguments.
func program(words []string) (string, []string) {
	for len(words) > 0 {
		switch w := words[0]; {
		case envAssign.MatchString(w), w == "env", w == "time", w == "exec", w == "command", w == "nohup":
			words = words[1:]
		case w == "sudo":
			words = words[1:]
			for len(words) > 0 && strings.HasPrefix(words[0], "-") {
				words = words[1:]
			}
		default:
			return w, words[1:]
		}
	}
	return "", nil
}

// helpCache runs NAME ARGS... --help once per argument list.
type helpCache struct {
	mu  sync.Mutex
	out map[string]string
}

var helps = helpCache{out: map[string]string{}}

func (h *helpCache) get(t *testing.T, name string, args ...string) string {
	t.Helper()
	key := name + " " + strings.Join(args, " ")
	h.mu.Lock()
	defer h.mu.Unlock()
	if out, ok := h.out[key]; ok {
		return out
	}
	cmd := exec.Command(filepath.Join(binDir, name), append(args, "--help")...)
	cmd.Env = append(os.Environ(), "GANTRY_CONFIG=/dev/null")
	out, _ := cmd.CombinedOutput() // some exit 2 after printing help
	if len(bytes.TrimSpace(out)) == 0 {
		t.Fatalf("%s --help printed nothing", key)
	}
	h.out[key] = string(out)
	return string(out)
}

// Flag names may hold dots inside (nvidia-ctk's --cdi.enabled, --csv.file).
var helpFlag = regexp.MustCompile(`(?:^|[\s,\[|])--?([A-Za-z?][A-Za-z0-9-]*(?:\.[A-Za-z0-9-]+)*)`)

// helpFlags returns the flag names a help text lists: from each option line
// (a line whose text starts with "-"), the flags before the description.
func helpFlags(help string) map[string]bool {
	flags := map[string]bool{"help": true, "h": true}
	for _, line := range strings.Split(help, "\n") {
		s := strings.TrimSpace(line)
		if !strings.HasPrefix(s, "-") {
			continue
		}
		if i := strings.Index(s, "  "); i > 0 {
			s = s[:i]
		}
		for _, m := range helpFlag.FindAllStringSubmatch(" "+s, -1) {
			flags[m[1]] = true
		}
	}
	return flags
}

var twoSpaces = regexp.MustCompile(`\s{2,}`)

// helpCommands returns the commands a help text lists under its heading:
// the name (up to words words) before the description of each indented
// line of that section.
func helpCommands(help, heading string, words int) map[string]bool {
	cmds := map[string]bool{}
	in := false
	for _, line := range strings.Split(help, "\n") {
		if strings.HasPrefix(line, heading) {
			in = true
			continue
		}
		if !in {
			continue
		}
		if !strings.HasPrefix(line, "  ") {
			if strings.TrimSpace(line) != "" {
				in = false
			}
			continue
		}
		name := strings.TrimSpace(twoSpaces.Split(strings.TrimSpace(line), 2)[0])
		if f := strings.Fields(name); len(f) >= 1 && len(f) <= words {
			cmds[strings.Join(f, " ")] = true
			cmds[f[0]] = true // a group's first word (cdi of cdi generate)
		}
	}
	return cmds
}

// flagsOf returns the flag names used in args, up to a "--".
func flagsOf(args []string) []string {
	var out []string
	for _, a := range args {
		if a == "--" {
			break
		}
		if len(a) > 1 && a[0] == '-' && a != "-" {
			name := strings.TrimLeft(a, "-")
			if i := strings.IndexByte(name, '='); i >= 0 {
				name = name[:i]
			}
			if name != "" {
				out = append(out, name)
			}
		}
	}
	return out
}

// gantryGlobalValue are gantry's global flags that take a value.
var gantryGlobalValue = map[string]bool{"gpus": true, "driver-root": true, "dev-root": true, "config": true}

// checkGantry: the command exists and its help lists every flag used.
func checkGantry(t *testing.T, args []string) error {
	top := helps.get(t, "gantry")
	cmds := helpCommands(top, "Commands:", 2)
	var rest []string
	var cmd []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		if strings.HasPrefix(a, "-") {
			name := strings.TrimLeft(a, "-")
			if gantryGlobalValue[name] && len(cmd) == 0 {
				i++ // its value
			}
			rest = append(rest, a)
			continue
		}
		switch {
		case len(cmd) == 0:
			if !cmds[a] {
				return fmt.Errorf("gantry has no command %q (gantry --help lists the commands)", a)
			}
			cmd = append(cmd, a)
		case len(cmd) == 1 && cmds[cmd[0]+" "+a]:
			cmd = append(cmd, a)
		case len(cmd) == 1 && hasGroup(cmds, cmd[0]):
			return fmt.Errorf("gantry %s has no subcommand %q", cmd[0], a)
		}
	}
	help := top
	if len(cmd) > 0 {
		if hasGroup(cmds, cmd[0]) && len(cmd) == 1 {
			return fmt.Errorf("gantry %s needs a subcommand", cmd[0])
		}
		help = helps.get(t, "gantry", cmd...)
	}
	known := helpFlags(help)
	if len(cmd) == 0 { // gantry [global flags]: the global flags of the top-level help
		for _, m := range regexp.MustCompile(`(?m)^\s+--([a-z-]+)`).FindAllStringSubmatch(top, -1) {
			known[m[1]] = true
		}
	}
	for _, f := range flagsOf(rest) {
		if !known[f] {
			return fmt.Errorf("gantry %s: flag -%s is not in its --help", strings.Join(cmd, " "), f)
		}
	}
	return nil
}

// hasGroup: name is the first word of two-word commands (cdi, hook, ...).
func hasGroup(cmds map[string]bool, name string) bool {
	for c := range cmds {
		if strings.HasPrefix(c, name+" ") {
			return true
		}
	}
	return false
}

func checkFlagsAgainst(t *testing.T, prog string, args []string, helpArgs ...string) error {
	known := helpFlags(helps.get(t, prog, helpArgs...))
	for _, f := range flagsOf(args) {
		if !known[f] {
			return fmt.Errorf("%s: flag -%s is not in %s --help", prog, f, strings.Join(append([]string{prog}, helpArgs...), " "))
		}
	}
	return nil
}

// checkNvctk: nvidia-ctk [--debug] COMMAND... [flags]: the command is one
// its --help lists, and its own --help lists every flag used.
func checkNvctk(t *testing.T, args []string) error {
	var cmd []string
	var rest []string
	for _, a := range args {
		if strings.HasPrefix(a, "-") || len(rest) > 0 {
			rest = append(rest, a)
			continue
		}
		cmd = append(cmd, a)
	}
	if len(cmd) == 0 {
		return nil
	}
	top := helps.get(t, "nvidia-ctk")
	if !helpCommands(top, "Commands:", 3)[strings.Join(cmd, " ")] {
		return fmt.Errorf("nvidia-ctk has no command %q (nvidia-ctk --help lists them)", strings.Join(cmd, " "))
	}
	return checkFlagsAgainst(t, "nvidia-ctk", rest, cmd...)
}

// checkNvcli: nvidia-container-cli [OPTION...] COMMAND [OPTION...].
func checkNvcli(t *testing.T, args []string) error {
	top := helps.get(t, "nvidia-container-cli")
	cmds := helpCommands(top, "Commands:", 1)
	for i, a := range args {
		if strings.HasPrefix(a, "-") {
			continue
		}
		if !cmds[a] {
			return fmt.Errorf("nvidia-container-cli has no command %q", a)
		}
		if err := checkFlagsAgainst(t, "nvidia-container-cli", args[:i]); err != nil {
			return err
		}
		return checkFlagsAgainst(t, "nvidia-container-cli", args[i+1:], a)
	}
	return checkFlagsAgainst(t, "nvidia-container-cli", args)
}

var makeTargetRe = regexp.MustCompile(`(?m)^([A-Za-z0-9_.-]+(?:[ \t]+[A-Za-z0-9_.-]+)*)[ \t]*:([^=]|$)`)

func makeTargets(t *testing.T) map[string]bool {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(repoRoot, "Makefile"))
	if err != nil {
		t.Fatal(err)
	}
	targets := map[string]bool{}
	for _, m := range makeTargetRe.FindAllStringSubmatch(string(b), -1) {
		for _, tg := range strings.Fields(m[1]) {
			targets[tg] = true
		}
	}
	return targets
}

// checkCommand checks one simple command; ok is false when it is not one of ours.
func checkCommand(t *testing.T, words []string, targets map[string]bool) (ours bool, err error) {
	prog, args := program(words)
	if prog == "" {
		return false, nil
	}
	base := filepath.Base(prog)
	switch {
	case base == "gantry" && (prog == "gantry" || strings.HasSuffix(prog, "bin/gantry")):
		return true, checkGantry(t, args)
	case base == "gantry-device-plugin" || base == "gantry-dra-plugin":
		return true, checkFlagsAgainst(t, base, args)
	case base == "gantry-hook" || base == "nvidia-container-runtime-hook":
		return true, checkFlagsAgainst(t, base, args)
	case base == "gantry-runtime" || base == "nvidia-container-runtime":
		if len(args) > 0 && args[0] == "--create-server" {
			// The create server's command line: its own --help.
			if err := checkFlagsAgainst(t, base, args[:1]); err != nil {
				return true, err
			}
			return true, checkFlagsAgainst(t, base, args[1:], args[0])
		}
		// runc's command line: only gantry-runtime's own --help/--version are checked.
		for _, f := range flagsOf(args) {
			if f == "version" || f == "help" {
				continue
			}
			if _, err := exec.LookPath("runc"); err != nil {
				continue
			}
			out, _ := exec.Command("runc", "--help").CombinedOutput()
			if !helpFlags(string(out))[f] {
				return true, fmt.Errorf("%s: flag -%s is neither runc's nor its own", base, f)
			}
		}
		return true, nil
	case base == "nvidia-container-cli":
		return true, checkNvcli(t, args)
	case base == "nvidia-ctk":
		return true, checkNvctk(t, args)
	case prog == "make":
		for _, a := range args {
			if strings.HasPrefix(a, "-") || strings.Contains(a, "=") {
				continue
			}
			if !targets[a] {
				return true, fmt.Errorf("make: no target %q in the Makefile", a)
			}
		}
		return true, nil
	case strings.HasSuffix(prog, ".sh") && (strings.HasPrefix(strings.TrimPrefix(prog, "./"), "scripts/") || strings.HasPrefix(strings.TrimPrefix(prog, "./"), "bench/")):
		st, err := os.Stat(filepath.Join(repoRoot, prog))
		if err != nil {
			return true, fmt.Errorf("%s does not exist", prog)
		}
		if st.Mode()&0o111 == 0 {
			return true, fmt.Errorf("%s is not executable", prog)
		}
		return true, nil
	}
	return false, nil
}

// TestCommandsExist checks every documented command line that runs one of
// our programs against the program.
func TestCommandsExist(t *testing.T) {
	trackSources()
	targets := makeTargets(t)
	checked := 0
	for _, file := range docFiles(t) {
		for _, b := range readBlocks(t, file) {
			if !isShell(b.lang) && !isTranscript(b) {
				continue
			}
			for _, line := range commandLines(b) {
				for _, words := range splitCommands(line.text) {
					ours, err := checkCommand(t, words, targets)
					if ours {
						checked++
					}
					if err != nil {
						t.Errorf("%s:%d: %s\n\t%s", file, line.at, err, line.text)
					}
				}
			}
		}
	}
	if checked < 40 {
		t.Errorf("only %d command lines of ours found in the docs; the extraction is broken", checked)
	}
	t.Logf("%d documented command lines checked", checked)
}

// TestDoctests runs the doctest blocks, file by file, each file's blocks in
// order in one sandbox (sandbox_test.go).
func TestDoctests(t *testing.T) {
	trackSources()
	if _, err := exec.LookPath("bash"); err != nil {
		t.Skip("bash not found")
	}
	total := 0
	for _, file := range docFiles(t) {
		var tests []block
		wantRoot := false
		for _, b := range readBlocks(t, file) {
			if b.doctest {
				tests = append(tests, b)
				wantRoot = wantRoot || b.root
			}
		}
		if len(tests) == 0 {
			continue
		}
		total += len(tests)
		t.Run(file, func(t *testing.T) {
			s := newSandbox(t, wantRoot)
			var skipped []string
			for _, b := range tests {
				if b.root && s.host == nil {
					skipped = append(skipped, b.where())
					continue
				}
				if tool := missingTool(b); tool != "" {
					skipped = append(skipped, b.where()+" ("+tool+" is not installed; scripts/deps.sh --test installs it)")
					continue
				}
				switch {
				case isShell(b.lang) && b.driver:
					script := doctestScript(b)
					out, err := s.withDriverHost(t, func() (string, error) { return s.run(t, script) })
					if err != nil {
						t.Errorf("%s: doctest failed: %v\n--- block as run\n%s--- output\n%s", b.where(), err, script, out)
					}
				case isShell(b.lang):
					script := doctestScript(b)
					if out, err := s.run(t, script); err != nil {
						t.Errorf("%s: doctest failed: %v\n--- block as run\n%s--- output\n%s", b.where(), err, script, out)
					}
				case isTranscript(b):
					checkTranscript(t, s, b)
				default:
					t.Errorf("%s: <!-- doctest --> on a %q block: only sh blocks and $ transcripts run", b.where(), b.lang)
				}
			}
			if len(skipped) > 0 {
				t.Skipf("not run: %s; %s", strings.Join(skipped, ", "), s.why)
			}
		})
	}
	if total == 0 {
		t.Fatal("no <!-- doctest --> blocks found")
	}
}

// doctestScript is the block as the sandbox runs it: a line notRun lists
// (it needs a daemon, a cluster or a GPU) becomes a no-op that names the
// test that runs it instead.
func doctestScript(b block) string {
	raw := strings.Split(strings.TrimSuffix(b.text, "\n"), "\n")
	for _, l := range commandLines(b) {
		e := notRunFor(displayLine(l.text))
		if e == nil {
			continue
		}
		for i := l.first; i <= l.last; i++ {
			raw[i] = ":"
		}
		raw[l.first] = ": not run here: " + shellQuote(displayLine(l.text)) + " " + shellQuote(e.ref())
	}
	return strings.Join(raw, "\n") + "\n"
}

func shellQuote(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

// optionalTools are programs a doctest may use that are not part of every
// installation; a block that needs a missing one is skipped, saying so.
var optionalTools = map[string]bool{"socat": true, "curl": true, "make": true, "gcc": true}

func missingTool(b block) string {
	for _, l := range commandLines(b) {
		if notRunFor(displayLine(l.text)) != nil {
			continue
		}
		for _, words := range splitCommands(l.text) {
			if prog, _ := program(words); optionalTools[prog] {
				if _, err := exec.LookPath(prog); err != nil {
					return prog
				}
			}
		}
	}
	return ""
}

// checkTranscript runs each "$ " command of a transcript block and compares
// its output (stdout and stderr) with the lines below it: whitespace runs
// compare equal, and a line "..." matches any number of lines. The exit
// status is not checked (transcripts show errors too).
func checkTranscript(t *testing.T, s *sandbox, b block) {
	type step struct {
		cmd  string
		want []string
		line int
	}
	var steps []step
	for i, line := range strings.Split(strings.TrimSuffix(b.text, "\n"), "\n") {
		if c, ok := strings.CutPrefix(line, "$ "); ok {
			steps = append(steps, step{cmd: c, line: b.line + 1 + i})
			continue
		}
		steps[len(steps)-1].want = append(steps[len(steps)-1].want, line)
	}
	for _, st := range steps {
		out, _ := s.run(t, st.cmd)
		got := strings.Split(strings.TrimRight(out, "\n"), "\n")
		if !matchLines(st.want, got) {
			t.Errorf("%s:%d: output of %q differs from the docs\n--- docs\n%s\n--- got\n%s",
				b.file, st.line, st.cmd, strings.Join(st.want, "\n"), out)
		}
	}
}

func norm(s string) string { return strings.Join(strings.Fields(s), " ") }

func matchLines(want, got []string) bool {
	if len(want) == 0 {
		return len(got) == 0 || (len(got) == 1 && got[0] == "")
	}
	if strings.TrimSpace(want[0]) == "..." {
		for i := 0; i <= len(got); i++ {
			if matchLines(want[1:], got[i:]) {
				return true
			}
		}
		return false
	}
	return len(got) > 0 && norm(want[0]) == norm(got[0]) && matchLines(want[1:], got[1:])
}

// TestTroubleshootingGenerated: troubleshooting.md is what internal/doctor's
// Checks render (go generate ./internal/doctor rewrites it).
func TestTroubleshootingGenerated(t *testing.T) {
	got, err := os.ReadFile("troubleshooting.md")
	if err != nil || string(got) != doctor.Troubleshooting() {
		t.Fatalf("docs/troubleshooting.md is stale or missing (%v): run go generate ./internal/doctor", err)
	}
}
