package main

import (
	"bytes"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The helper runs inside a container (as /.berth/helper), so that nothing but /bin/sh is asked
// of an image:
//
//	helper pause                 the container's pid 1: reaps orphans, exits on SIGTERM
//	helper run TAG -- COMMAND    runs /bin/sh -c COMMAND in a new session with BERTH_TAG=TAG,
//	                             relays its output and exit status, and on its end kills
//	                             whatever is left that carries the tag
//	helper kill TAG GRACE_MS     SIGTERM to every process carrying the tag, SIGKILL after the
//	                             grace, and returns when none is left
const helperPath = "/.berth/helper"

// tagVar marks every process a command or service started, across sessions and daemonizing.
const tagVar = "BERTH_TAG"

func helper(args []string) error {
	switch {
	case len(args) == 1 && args[0] == "pause":
		return pause()
	case len(args) >= 4 && args[0] == "run" && args[2] == "--":
		return runTagged(args[1], strings.Join(args[3:], " "))
	case len(args) == 3 && args[0] == "kill":
		grace, err := strconv.Atoi(args[2])
		if err != nil {
			return fmt.Errorf("kill: grace must be milliseconds")
		}
		return killTagged(args[1], time.Duration(grace)*time.Millisecond)
	}
	return errors.New("usage: helper pause | run TAG -- COMMAND | kill TAG GRACE_MS")
}

// pause waits for SIGTERM and reaps every child that is re-parented to it.
func pause() error {
	sig := make(chan os.Signal, 4)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGCHLD)
	for s := range sig {
		if s != syscall.SIGCHLD {
			return nil
		}
		for {
			var ws syscall.WaitStatus
			pid, err := syscall.Wait4(-1, &ws, syscall.WNOHANG, nil)
			if pid <= 0 || err != nil {
				break
			}
		}
	}
	return nil
}

// runTagged runs the command and exits with its status; a signal that ends the helper is
// forwarded to the command's session first.
func runTagged(tag, command string) error {
	cmd := exec.Command("/bin/sh", "-c", command)
	cmd.Stdin, cmd.Stdout, cmd.Stderr = os.Stdin, os.Stdout, os.Stderr
	cmd.Env = append(os.Environ(), tagVar+"="+tag)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return err
	}
	sig := make(chan os.Signal, 2)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT, syscall.SIGHUP)
	go func() {
		for s := range sig {
			_ = syscall.Kill(-cmd.Process.Pid, s.(syscall.Signal))
		}
	}()
	err := cmd.Wait()
	_ = killTagged(tag, 0) // what the command left behind ends with it
	code := 0
	var ee *exec.ExitError
	switch {
	case errors.As(err, &ee):
		if ws, ok := ee.Sys().(syscall.WaitStatus); ok && ws.Signaled() {
			code = 128 + int(ws.Signal())
		} else {
			code = ee.ExitCode()
		}
	case err != nil:
		return err
	}
	os.Exit(code)
	return nil
}

// killTagged ends every process whose environment carries tag: SIGTERM, then SIGKILL after the
// grace, until none is left (at most 10 s after the SIGKILL).
func killTagged(tag string, grace time.Duration) error {
	want := []byte(tagVar + "=" + tag)
	find := func() []int {
		var pids []int
		dirs, _ := filepath.Glob("/proc/[0-9]*")
		for _, d := range dirs {
			pid, err := strconv.Atoi(filepath.Base(d))
			if err != nil || pid == 1 || pid == os.Getpid() {
				continue
			}
			env, err := os.ReadFile(d + "/environ")
			if err != nil {
				continue
			}
			if stat, err := os.ReadFile(d + "/stat"); err == nil {
				if i := bytes.LastIndexByte(stat, ')'); i > 0 && i+2 < len(stat) && (stat[i+2] == 'Z' || stat[i+2] == 'X') {
					continue // a zombie is gone; its parent reaps it
				}
			}
			for _, kv := range bytes.Split(env, []byte{0}) {
				if bytes.Equal(kv, want) {
					pids = append(pids, pid)
					break
				}
			}
		}
		return pids
	}
	signalAll := func(s syscall.Signal) int {
		pids := find()
		for _, p := range pids {
			_ = syscall.Kill(p, s)
		}
		return len(pids)
	}
	if signalAll(syscall.SIGTERM) == 0 {
		return nil
	}
	deadline := time.Now().Add(grace)
	for time.Now().Before(deadline) && len(find()) > 0 {
		time.Sleep(50 * time.Millisecond)
	}
	end := time.Now().Add(10 * time.Second)
	for signalAll(syscall.SIGKILL) > 0 {
		if time.Now().After(end) {
			return errors.New("processes survived SIGKILL")
		}
		time.Sleep(50 * time.Millisecond)
	}
	return nil
}
