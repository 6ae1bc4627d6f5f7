package environment

import (
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"path"
	"slices"
	"sync"

	"berth/environment/driverpb"
)

// RemoteTerminals is a driver that opens interactive shells on its instances (a plugin that
// names the terminal capability): what a setup session of a plugin environment talks to.
type RemoteTerminals interface {
	// Acquire and Release are the instance's lifecycle (Driver's).
	Acquire(ctx context.Context, req AcquireRequest) (Instance, error)
	Release(ctx context.Context, inst Instance) error
	// OpenTerminal starts a shell on inst in dir (empty: the plugin's default) at cols×rows.
	OpenTerminal(ctx context.Context, inst Instance, dir string, cols, rows int, env map[string]string) (*PluginTerminal, error)
}

// TerminalsOf is drv's terminal side: ok is false for this host's drivers; for a plugin that does
// not name the terminal capability the error wraps ErrTerminalUnsupported.
func TerminalsOf(ctx context.Context, drv Driver) (RemoteTerminals, bool, error) {
	d, ok := drv.(*pluginDriver)
	if !ok {
		return nil, false, nil
	}
	info, err := d.Info(ctx)
	if err != nil {
		return nil, true, err
	}
	if !slices.Contains(info.Capabilities, CapabilityTerminal) {
		return nil, true, fmt.Errorf("plugin %s (%s %s) offers no terminal (its Info names no %q capability): %w",
			d.cfg.Name, info.Name, info.Version, CapabilityTerminal, ErrTerminalUnsupported)
	}
	return d, true, nil
}

// PluginTerminal is a shell on a plugin's instance behind the plugin's Terminal stream. It has
// the shape of terminal.Pty (Read, Write, Resize, Wait, Close), so the WebSocket bridge serves it
// as it serves a local pty. One goroutine receives: output goes to a pipe Read drains, the exit
// event (or the stream's end) settles Wait.
type PluginTerminal struct {
	stream driverpb.Driver_TerminalClient
	cancel context.CancelFunc
	out    *io.PipeReader
	sendMu sync.Mutex // gRPC streams allow one sender at a time
	exited chan struct{}
	code   int
	once   sync.Once
}

// OpenTerminal implements RemoteTerminals. The stream lives until Close (or the shell's end),
// not as long as ctx: ctx bounds only the opening.
func (d *pluginDriver) OpenTerminal(ctx context.Context, inst Instance, dir string, cols, rows int, env map[string]string) (*PluginTerminal, error) {
	ref, err := refOf(inst)
	if err != nil {
		return nil, fmt.Errorf("terminal: %w", err)
	}
	if dir != "" && (!path.IsAbs(dir) || path.Clean(dir) != dir) {
		return nil, fmt.Errorf("terminal: dir must be an absolute clean path: %w", ErrInvalidRequest)
	}
	if cols < 1 || rows < 1 || cols > 1000 || rows > 1000 {
		return nil, fmt.Errorf("terminal: %dx%d is out of range: %w", cols, rows, ErrInvalidRequest)
	}
	p, err := d.host.proc(ctx, d.cfg)
	if err != nil {
		return nil, fmt.Errorf("terminal: %w", err)
	}
	vars := map[string]string{"LANG": "C.UTF-8", "TERM": "xterm-256color"}
	maps.Copy(vars, d.env)
	maps.Copy(vars, env)
	sctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stream, err := p.rpc.Terminal(sctx)
	if err == nil {
		err = stream.Send(&driverpb.TerminalInput{Part: &driverpb.TerminalInput_Open{Open: &driverpb.TerminalOpen{
			Settings: d.cfg.Settings, Ref: ref, Dir: dir, Cols: uint32(cols), Rows: uint32(rows), Env: vars}}})
	}
	if err != nil {
		cancel()
		return nil, d.failed(ctx, p, "terminal", pluginCallTimeout, err)
	}
	pr, pw := io.Pipe()
	t := &PluginTerminal{stream: stream, cancel: cancel, out: pr, exited: make(chan struct{}), code: -1}
	go t.receive(pw)
	return t, nil
}

// receive pumps the plugin's output into the pipe until the exit event or the stream's end.
func (t *PluginTerminal) receive(pw *io.PipeWriter) {
	defer close(t.exited)
	for {
		msg, err := t.stream.Recv()
		if err != nil {
			pw.CloseWithError(io.EOF)
			return
		}
		switch m := msg.Part.(type) {
		case *driverpb.TerminalOutput_Data:
			if _, err := pw.Write(m.Data); err != nil {
				return // Close: nobody reads any more
			}
		case *driverpb.TerminalOutput_Exit:
			t.code = int(m.Exit.ExitCode)
			pw.CloseWithError(io.EOF)
			return
		}
	}
}

// Read returns the shell's output; io.EOF once it ended.
func (t *PluginTerminal) Read(p []byte) (int, error) { return t.out.Read(p) }

// Write sends input to the shell.
func (t *PluginTerminal) Write(p []byte) (int, error) {
	if err := t.send(&driverpb.TerminalInput{Part: &driverpb.TerminalInput_Data{Data: append([]byte(nil), p...)}}); err != nil {
		return 0, err
	}
	return len(p), nil
}

// Resize forwards a window size to the plugin, which sets it on the shell's pty.
func (t *PluginTerminal) Resize(cols, rows int) error {
	if cols < 1 || rows < 1 || cols > 1000 || rows > 1000 {
		return fmt.Errorf("resize: %dx%d is out of range", cols, rows)
	}
	return t.send(&driverpb.TerminalInput{Part: &driverpb.TerminalInput_Resize{Resize: &driverpb.Resize{Cols: uint32(cols), Rows: uint32(rows)}}})
}

func (t *PluginTerminal) send(m *driverpb.TerminalInput) error {
	select {
	case <-t.exited:
		return errors.New("terminal: the shell has ended")
	default:
	}
	t.sendMu.Lock()
	defer t.sendMu.Unlock()
	if err := t.stream.Send(m); err != nil {
		return fmt.Errorf("terminal: %w", callError(err))
	}
	return nil
}

// Wait blocks until the shell has ended and returns its exit code (-1 when the stream broke).
func (t *PluginTerminal) Wait() int {
	<-t.exited
	return t.code
}

// Close ends the stream (the plugin kills the shell when its input ends) and waits for the
// receiver.
func (t *PluginTerminal) Close() error {
	t.once.Do(func() {
		t.sendMu.Lock()
		_ = t.stream.CloseSend()
		t.sendMu.Unlock()
		t.cancel()
		t.out.Close()
		<-t.exited
	})
	return nil
}
