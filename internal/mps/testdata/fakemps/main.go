// Command fakemps stands in for nvidia-cuda-mps-control in tests, with the
// same process model and command protocol:
//
//	fakemps -d   starts a daemon (a new session, detached) that listens on
//	             $CUDA_MPS_PIPE_DIRECTORY/control, then returns once it answers;
//	             fails when a daemon already answers there
//	fakemps      sends each line of standard input to that daemon and prints
//	             each reply; fails when no daemon answers
//
// The daemon appends "start <CUDA_VISIBLE_DEVICES>" and every command it
// gets to $CUDA_MPS_LOG_DIRECTORY/control.log, writes its pid to
// $CUDA_MPS_PIPE_DIRECTORY/fake.pid, answers get_default_active_thread_percentage
// with the value set last (100.0 at first), and on quit removes its socket
// and exits (as it does when its socket is removed).
package main

import (
	"bufio"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

func main() {
	pipe := os.Getenv("CUDA_MPS_PIPE_DIRECTORY")
	sock := filepath.Join(pipe, "control")
	switch {
	case os.Getenv("FAKEMPS_DAEMON") == "1":
		daemon(sock)
	case len(os.Args) > 1 && os.Args[1] == "-d":
		if c, err := net.Dial("unix", sock); err == nil {
			c.Close()
			fmt.Println("An instance of this daemon is already running")
			os.Exit(1)
		}
		os.Remove(sock) // stale, from a killed daemon
		cmd := exec.Command(os.Args[0])
		cmd.Env = append(os.Environ(), "FAKEMPS_DAEMON=1")
		cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
		if err := cmd.Start(); err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		cmd.Process.Release()
	default:
		client(sock)
	}
}

func client(sock string) {
	c, err := net.Dial("unix", sock)
	if err != nil {
		fmt.Fprintln(os.Stderr, "Cannot find MPS control daemon process")
		os.Exit(1)
	}
	defer c.Close()
	replies := bufio.NewScanner(c)
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		line := strings.TrimSpace(in.Text())
		if line == "" {
			continue
		}
		fmt.Fprintln(c, line)
		if !replies.Scan() {
			if line == "quit" {
				return
			}
			fmt.Fprintln(os.Stderr, "daemon closed the connection")
			os.Exit(1)
		}
		if r := replies.Text(); r != "" {
			fmt.Println(r)
		}
	}
}

func daemon(sock string) {
	logf, err := os.OpenFile(filepath.Join(os.Getenv("CUDA_MPS_LOG_DIRECTORY"), "control.log"), os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644)
	if err != nil {
		os.Exit(1)
	}
	ln, err := net.Listen("unix", sock)
	if err != nil {
		fmt.Fprintln(logf, "listen:", err)
		os.Exit(1)
	}
	os.WriteFile(filepath.Join(filepath.Dir(sock), "fake.pid"), []byte(strconv.Itoa(os.Getpid())), 0o644)
	fmt.Fprintln(logf, "start", os.Getenv("CUDA_VISIBLE_DEVICES"))
	var mu sync.Mutex
	threads := "100.0"
	// handle answers one command; a quit ends the process.
	handle := func(cmd string) string {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintln(logf, cmd)
		f := strings.Fields(cmd)
		switch {
		case len(f) == 0:
		case f[0] == "quit":
			ln.Close()
			os.Remove(sock)
			os.Exit(0)
		case f[0] == "get_default_active_thread_percentage":
			return threads
		case f[0] == "set_default_active_thread_percentage" && len(f) == 2:
			threads = f[1] + ".0"
		case f[0] == "set_default_device_pinned_mem_limit" && len(f) == 3:
		default:
			return "unknown command " + f[0]
		}
		return ""
	}
	// A test that failed before its quit leaves no daemon behind: one whose
	// socket is gone (the test's directory removed) exits.
	go func() {
		for range time.Tick(time.Second) {
			if _, err := os.Stat(sock); err != nil {
				os.Exit(0)
			}
		}
	}()
	for {
		c, err := ln.Accept()
		if err != nil {
			return
		}
		go func() {
			defer c.Close()
			s := bufio.NewScanner(c)
			for s.Scan() {
				fmt.Fprintln(c, handle(s.Text()))
			}
		}()
	}
}
