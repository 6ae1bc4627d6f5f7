// Package imagesetup runs image setup sessions on this node (docs/terminal.md). It owns what a
// session is on disk and in memory here: its scratch layer (the copy of its base image version
// that its shell changes and capture_image later packs), its shell in the node's terminal
// registry (the setup jail over the scratch layer on a pty, or a plugin environment's terminal
// on the session's instance) and its transcript. It knows the data dir's layout
// (environment/datadir), the setup shell (environment, environment/jail) and the bridge
// (terminal); it knows nothing of the database or HTTP: its caller checks who may open a
// session, records the session's state and audits it. It makes a session's files and never
// removes them: a failed start, a cancel, the capture and the expiry do (jobs.RemoveSetupFiles).
package imagesetup

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail"
	"berth/terminal"
)

// Sessions runs this node's setup sessions: the data dir their layers and transcripts live in,
// the jail host their shells run in, and the registry of live shells.
type Sessions struct {
	Data      datadir.Layout     // image layers, scratch layers, session directories
	Jail      *jail.Host         // nil: no local setup shells here (plugin environments' sessions only)
	Terminals *terminal.Registry // the live shells, by session id
}

// Session is what this node needs to know of one setup session to run its shell.
type Session struct {
	ID            string
	EnvironmentID string
	BaseVersion   int                       // the image version copied into the scratch layer
	Expires       time.Time                 // the registry ends the shell then
	Sandbox       environment.SandboxConfig // the sandbox environment's config (setup network, limits)
	// Remote, when set, makes the shell a plugin environment's terminal on the session's
	// instance: nothing is copied and nothing runs on this node.
	Remote *Remote
}

// Remote is a plugin environment's terminal: the instance acquired for the session and the
// driver that opens terminals on it.
type Remote struct {
	Terminals environment.RemoteTerminals
	Instance  environment.Instance
}

// ErrUnavailable means this node cannot run the session's shell: it has no data dir, no terminal
// registry, or (for a sandbox session) no jail.
var ErrUnavailable = errors.New("setup sessions need the data dir, the terminal registry and, for sandboxes, bubblewrap on this node")

// remoteOpenTimeout bounds opening a plugin's terminal stream (the stream itself lives on).
const remoteOpenTimeout = 2 * time.Minute

// Open makes the session live on this node: a sandbox session's base version is copied into its
// scratch layer, then its shell is started in the registry, with its transcript; the shell lives
// until the session is closed or expires. ctx is checked before the copy and before the start (a
// request that is gone gets no shell); a copy under way runs to its end. Errors are returned as
// they happened, unwrapped, since the caller records their text as the session's failure; on an
// error the caller discards the session (Terminals.Close and its files).
func (n *Sessions) Open(ctx context.Context, s Session) error {
	if err := n.usable(s); err != nil {
		return err
	}
	if s.Remote == nil {
		if err := ctx.Err(); err != nil {
			return err
		}
		if err := n.copyLayer(s); err != nil {
			return err
		}
	}
	if err := ctx.Err(); err != nil { // the request is gone: start no shell for it
		return err
	}
	_, err := n.Terminals.Open(s.ID, n.starter(s), s.Expires, n.transcript(s.ID))
	return err
}

// Attach is what the registry needs for a client attaching to the session: the start of its
// shell when none runs (it exited, its grace period passed, or this node restarted), its expiry
// and its transcript.
func (n *Sessions) Attach(s Session) terminal.Attach {
	return terminal.Attach{Start: n.starter(s), Expires: s.Expires, Transcript: n.transcript(s.ID)}
}

// usable checks that this node can run s and that its ids are safe as path elements.
func (n *Sessions) usable(s Session) error {
	if n.Data.Root == "" || n.Terminals == nil || (s.Remote == nil && n.Jail == nil) {
		return ErrUnavailable
	}
	for _, id := range []string{s.ID, s.EnvironmentID} {
		if id == "" || id == "." || id == ".." || strings.ContainsAny(id, `/\`) {
			return fmt.Errorf("setup session: %q is not an id", id)
		}
	}
	return nil
}

// starter starts the session's shell: the setup jail over the scratch layer on a new pty, or the
// plugin's terminal on the session's instance.
func (n *Sessions) starter(s Session) terminal.StartFunc {
	if s.Remote != nil {
		r := *s.Remote
		return func() (terminal.Pty, error) {
			ctx, cancel := context.WithTimeout(context.Background(), remoteOpenTimeout)
			defer cancel()
			t, err := r.Terminals.OpenTerminal(ctx, r.Instance, "", 80, 24, nil)
			if err != nil {
				return nil, err
			}
			return t, nil
		}
	}
	data, host := n.Data, n.Jail
	return func() (terminal.Pty, error) {
		if host == nil {
			return nil, ErrUnavailable
		}
		t, err := environment.StartSetupShell(environment.SetupShell{Jail: *host, DataDir: data.Root,
			Layer: data.ScratchLayer(s.EnvironmentID, s.ID), Workspace: data.SetupWorkspace(s.ID), Config: s.Sandbox}, 80, 24)
		if err != nil {
			return nil, err
		}
		return t, nil
	}
}
