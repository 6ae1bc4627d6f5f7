package environment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path"
	"strings"
	"sync"
	"time"

	"berth/environment/driverpb"
)

// cancelWait is how long a cancelled or timed-out plugin command may take to report its end,
// beyond the grace between SIGTERM and SIGKILL.
const cancelWait = 15 * time.Second

// Exec runs the command on the plugin's instance. The plugin enforces the timeout; Berth's own
// deadline is that timeout plus the grace and cancelWait, after which the command counts as not
// gone. When ctx ends, Berth asks the plugin to cancel the command and waits for its end.
func (d *pluginDriver) Exec(ctx context.Context, req ExecRequest) (ExecResult, error) {
	res := ExecResult{ExitCode: -1}
	if strings.TrimSpace(req.Command) == "" || strings.ContainsRune(req.Command, 0) {
		return res, fmt.Errorf("exec: command must be non-empty without NUL: %w", ErrInvalidRequest)
	}
	if !path.IsAbs(req.Dir) || strings.ContainsRune(req.Dir, 0) {
		return res, fmt.Errorf("exec: dir must be an absolute path on the instance: %w", ErrInvalidRequest)
	}
	if err := checkTag(req.Tag); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	if req.Timeout < 0 {
		return res, fmt.Errorf("exec: timeout must not be negative: %w", ErrInvalidRequest)
	}
	if limit := time.Duration(d.cfg.TimeoutS) * time.Second; limit > 0 && (req.Timeout == 0 || req.Timeout > limit) {
		req.Timeout = limit
	}
	envList, err := commandEnv(req, map[string]string{"LANG": "C.UTF-8", "TERM": "dumb"}, d.env)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	if err := ctx.Err(); err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	p, err := d.host.proc(ctx, d.cfg)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	ref, err := d.refFor(req.Dir)
	if err != nil {
		return res, fmt.Errorf("exec: %w", err)
	}
	// The stream outlives ctx: after a cancel Berth still wants the command's end.
	sctx, cancelStream := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelStream()
	if req.Timeout > 0 {
		var c context.CancelFunc
		sctx, c = context.WithTimeout(sctx, req.Timeout+d.grace+cancelWait)
		defer c()
	}
	stream, err := p.rpc.Exec(sctx, &driverpb.ExecRequest{Settings: d.cfg.Settings, Ref: ref, Command: req.Command,
		Dir: req.Dir, Env: envMap(envList), TimeoutMs: req.Timeout.Milliseconds(), Tag: req.Tag, GraceMs: d.grace.Milliseconds()})
	if err != nil {
		return res, d.failed(ctx, p, "exec", pluginCallTimeout, err)
	}
	ended := make(chan struct{})
	defer close(ended)
	var mu sync.Mutex
	cancelled := false
	go func() {
		select {
		case <-ended:
			return
		case <-ctx.Done():
		}
		mu.Lock()
		cancelled = true
		mu.Unlock()
		cctx, cancel := context.WithTimeout(context.Background(), pluginCallTimeout)
		_, _ = p.rpc.Cancel(cctx, &driverpb.CancelRequest{Settings: d.cfg.Settings, Ref: ref, Tag: req.Tag})
		cancel()
		t := time.NewTimer(d.grace + cancelWait)
		defer t.Stop()
		select {
		case <-ended:
		case <-t.C:
			cancelStream()
		}
	}()
	log := req.Log
	if log == nil {
		log = io.Discard
	}
	var exited *driverpb.Exited
	for {
		ev, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			mu.Lock()
			wasCancelled := cancelled
			mu.Unlock()
			if wasCancelled || sctx.Err() != nil {
				res.Cancelled = wasCancelled
				return res, fmt.Errorf("exec: plugin %s did not report the command's end in time: %w", d.cfg.Name, ErrNotGone)
			}
			return res, d.failed(ctx, p, "exec", pluginCallTimeout, err)
		}
		switch e := ev.Event.(type) {
		case *driverpb.ExecEvent_Started:
			res.PID = int(e.Started.Pid)
			res.Started = time.Unix(0, e.Started.UnixNano)
			if res.Started.IsZero() || e.Started.UnixNano == 0 {
				res.Started = time.Now()
			}
			if req.OnStart != nil {
				req.OnStart(res.PID)
			}
		case *driverpb.ExecEvent_Output:
			_, _ = log.Write(e.Output)
		case *driverpb.ExecEvent_Exited:
			exited = e.Exited
		}
	}
	if exited == nil {
		return res, fmt.Errorf("exec: plugin %s ended the command's stream without its end: %w", d.cfg.Name, ErrNotGone)
	}
	if res.Started.IsZero() {
		res.Started = time.Now()
	}
	res.ExitCode, res.Signaled, res.TimedOut, res.Cancelled = int(exited.ExitCode), exited.Signaled, exited.TimedOut, exited.Cancelled
	res.Finished = time.Unix(0, exited.UnixNano)
	if exited.UnixNano == 0 {
		res.Finished = time.Now()
	}
	mu.Lock()
	if cancelled && !res.TimedOut {
		res.Cancelled = true
	}
	mu.Unlock()
	return res, nil
}

// refFor is the plugin ref of the instance whose realized root holds dir.
func (d *pluginDriver) refFor(dir string) (string, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	for root, ref := range d.roots {
		if dir == root || strings.HasPrefix(dir, strings.TrimSuffix(root, "/")+"/") {
			return ref, nil
		}
	}
	return "", fmt.Errorf("%s is no workspace this driver realized: %w", dir, ErrInvalidRequest)
}
