// Package procfs reads the few per-process facts Gantry's front ends and
// doctor take from /proc: a process's parent and its start time
// (/proc/PID/stat), the cgroup that decides its device access and that
// cgroup's directory (/proc/PID/cgroup, cgroup.go), and mountinfo's escapes.
// proc is the proc filesystem's root ("/proc", or a test's copy).
package procfs

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// StatFields are the fields of proc/PID/stat after the command name (field
// 2, which may hold spaces and parentheses): the state (field 3) is the
// first.
func StatFields(proc string, pid int) ([]string, error) {
	p := filepath.Join(proc, strconv.Itoa(pid), "stat")
	b, err := os.ReadFile(p)
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("%s: unexpected format", p)
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 20 {
		return nil, fmt.Errorf("%s: unexpected format", p)
	}
	return f, nil
}

// Parent is pid's parent (field 4).
func Parent(proc string, pid int) (int, error) {
	f, err := StatFields(proc, pid)
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(f[1])
}

// StartTime is pid's start time (field 22, in clock ticks since boot):
// with the pid (and the boot), it names one process for good.
func StartTime(proc string, pid int) (uint64, error) {
	f, err := StatFields(proc, pid)
	if err != nil {
		return 0, err
	}
	return strconv.ParseUint(f[19], 10, 64)
}

// UnescapeMountinfo undoes the octal escapes of /proc/PID/mountinfo's
// paths (\040 for a space, \011, \012, \134).
func UnescapeMountinfo(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if n, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(n))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
