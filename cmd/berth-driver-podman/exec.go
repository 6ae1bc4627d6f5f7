package main

import (
	"context"
	"errors"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"berth/environment/driverpb"
)

// running is one Exec in progress, so Cancel can find it by tag.
type running struct {
	stop func(cancelled bool)
}

var (
	runningMu sync.Mutex
	runningBy = map[string]*running{} // by container + "/" + tag
)

// envFile writes a command's environment to a 0600 file for podman's --env-file, so values (the
// run token among them) never appear in a process list.
func envFile(dir string, env map[string]string) (string, error) {
	keys := make([]string, 0, len(env))
	for k, v := range env {
		if k == "" || strings.ContainsAny(k, "=\n\x00") || strings.ContainsAny(v, "\n\x00") {
			return "", status.Errorf(codes.InvalidArgument, "env %q: names without '=' and values without newlines", k)
		}
		keys = append(keys, k)
	}
	sort.Strings(keys)
	var b strings.Builder
	for _, k := range keys {
		b.WriteString(k + "=" + env[k] + "\n")
	}
	f, err := os.CreateTemp(dir, "env-")
	if err != nil {
		return "", err
	}
	defer f.Close()
	if _, err := f.WriteString(b.String()); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// Exec runs the command in the container through the helper (its own session, tagged), relays
// its output, and on timeout or cancel has the helper end every process carrying the tag.
func (s *server) Exec(req *driverpb.ExecRequest, stream driverpb.Driver_ExecServer) error {
	set, err := parseSettings(req.Settings)
	if err != nil {
		return err
	}
	if err := checkRef(req.Ref); err != nil {
		return err
	}
	if req.Command == "" || req.Tag == "" || strings.ContainsAny(req.Tag, " \n\x00") || !filepath.IsAbs(req.Dir) {
		return status.Error(codes.InvalidArgument, "exec: a command, a tag without spaces and an absolute dir are required")
	}
	ctx := stream.Context()
	env, err := envFile(filepath.Join(s.state, "tmp"), req.Env)
	if err != nil {
		return err
	}
	defer os.Remove(env)
	cmd := set.podmanCmd("exec", "--workdir", req.Dir, "--env-file", env, req.Ref, helperPath, "run", req.Tag, "--", req.Command)
	pr, pw, err := os.Pipe()
	if err != nil {
		return errorf("exec: %v", err)
	}
	cmd.Stdout, cmd.Stderr = pw, pw
	if err := cmd.Start(); err != nil {
		pr.Close()
		pw.Close()
		return errorf("exec: %v", err)
	}
	pw.Close()
	started := time.Now()
	var sendMu sync.Mutex
	send := func(ev *driverpb.ExecEvent) error {
		sendMu.Lock()
		defer sendMu.Unlock()
		return stream.Send(ev)
	}
	_ = send(&driverpb.ExecEvent{Event: &driverpb.ExecEvent_Started{Started: &driverpb.Started{Pid: int64(cmd.Process.Pid),
		UnixNano: started.UnixNano()}}})

	grace := time.Duration(req.GraceMs) * time.Millisecond
	var once sync.Once
	var timedOut, cancelled bool
	var stopMu sync.Mutex
	stopped := make(chan struct{})
	stop := func(byCancel bool) {
		once.Do(func() {
			stopMu.Lock()
			if byCancel {
				cancelled = true
			} else {
				timedOut = true
			}
			stopMu.Unlock()
			kctx, cancel := context.WithTimeout(context.Background(), grace+30*time.Second)
			defer cancel()
			_, _ = run(kctx, set.podmanCmd("exec", req.Ref, helperPath, "kill", req.Tag, strconv.FormatInt(grace.Milliseconds(), 10)), nil)
			close(stopped)
		})
	}
	key := req.Ref + "/" + req.Tag
	runningMu.Lock()
	runningBy[key] = &running{stop: stop}
	runningMu.Unlock()
	defer func() {
		runningMu.Lock()
		delete(runningBy, key)
		runningMu.Unlock()
	}()
	var timer *time.Timer
	if req.TimeoutMs > 0 {
		timer = time.AfterFunc(time.Duration(req.TimeoutMs)*time.Millisecond, func() { stop(false) })
		defer timer.Stop()
	}
	go func() { // Berth gone: end the command too
		select {
		case <-ctx.Done():
			stop(true)
		case <-stopped:
		}
	}()
	buf := make([]byte, 32<<10)
	for {
		n, rerr := pr.Read(buf)
		if n > 0 {
			_ = send(&driverpb.ExecEvent{Event: &driverpb.ExecEvent_Output{Output: append([]byte(nil), buf[:n]...)}})
		}
		if rerr != nil {
			break
		}
	}
	pr.Close()
	werr := cmd.Wait()
	code := 0
	var ee *exec.ExitError
	if errors.As(werr, &ee) {
		code = ee.ExitCode()
	} else if werr != nil {
		return errorf("exec: %v", werr)
	}
	stopMu.Lock()
	ex := &driverpb.Exited{ExitCode: int32(code), Signaled: code > 128 && code < 128+65, TimedOut: timedOut, Cancelled: cancelled && !timedOut,
		UnixNano: time.Now().UnixNano()}
	stopMu.Unlock()
	if ex.TimedOut || ex.Cancelled {
		<-stopped // every tagged process is gone (or the kill gave up)
	}
	return send(&driverpb.ExecEvent{Event: &driverpb.ExecEvent_Exited{Exited: ex}})
}

// Cancel stops a running Exec by tag; one that already ended is not an error.
func (s *server) Cancel(_ context.Context, req *driverpb.CancelRequest) (*driverpb.CancelResponse, error) {
	runningMu.Lock()
	r := runningBy[req.Ref+"/"+req.Tag]
	runningMu.Unlock()
	if r != nil {
		go r.stop(true)
	}
	return &driverpb.CancelResponse{}, nil
}
