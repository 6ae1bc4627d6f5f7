package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/jobs"
	"berth/terminal"
	"berth/terminal/imagesetup"
)

// Setup sessions of plugin environments (docs/plugins.md "Services and terminals"): the shell is
// the plugin's Terminal on an instance acquired for the session from the environment's active
// image version; nothing runs on this host. The bridge is the same (terminal.Registry): the
// plugin's stream has the shape of a pty (environment.PluginTerminal). Protocol version 1 has no
// image capture, so Finish is refused (image_capture_unsupported) and Cancel ends the session;
// plugin environments get new versions by import.

var errPluginSetupUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "environment_unavailable",
	Message: "Setup sessions of plugin environments need plugins (BERTH_PLUGIN_DIR) and the data dir on this server."}

var errCaptureUnsupported = &httpError{Status: http.StatusConflict, Code: "image_capture_unsupported",
	Message: "A plugin environment's setup session cannot be captured into an image version (the driver protocol has no capture): import an image instead, and cancel to end this session."}

// pluginTerminalOpen bounds the plugin calls that end a session's instance (a failed start, a
// cancel); imagesetup bounds opening its terminal the same way.
const pluginTerminalOpen = 2 * time.Minute

// pluginDeps are the jobs dependencies that build a plugin environment's driver here.
func (s *Server) pluginDeps() jobs.Deps {
	is := s.imageSetup
	return jobs.Deps{Pool: s.pool, Data: is.Data, Plugins: is.Plugins, Secrets: s.secrets, NodeID: s.nodes.self()}
}

// isPluginEnvironment reports whether environment envID of the company is a plugin's.
func (s *Server) isPluginEnvironment(ctx context.Context, companyID, envID string) (db.Environment, bool) {
	env, err := db.EnvironmentByID(ctx, s.pool, companyID, envID)
	return env, err == nil && env.Driver == environment.DriverPlugin
}

// startPluginSetupSession is startSetupSession for a plugin environment: the plugin must offer
// a terminal (409 terminal_unsupported, nothing recorded), the environment needs an active image
// version (409 no_image_version), then the session is recorded, its instance acquired and the
// plugin's terminal opened on it. A failure after the record leaves the session failed and its
// instance released.
func (s *Server) startPluginSetupSession(r *http.Request, a access, env db.Environment, ttl time.Duration) (db.SetupSession, error) {
	ctx := r.Context()
	is := s.imageSetup
	if is == nil || is.Plugins == nil || is.Data.Root == "" || is.Terminals == nil {
		return db.SetupSession{}, errPluginSetupUnavailable
	}
	if _, err := jobs.SetupTerminals(ctx, s.pluginDeps(), env); err != nil {
		if errors.Is(err, environment.ErrTerminalUnsupported) {
			return db.SetupSession{}, &httpError{Status: http.StatusConflict, Code: "terminal_unsupported",
				Message: "This environment's plugin offers no terminal (its Info names no \"terminal\" capability)."}
		}
		if errors.Is(err, environment.ErrDriverUnavailable) || errors.Is(err, environment.ErrPluginDigest) {
			return db.SetupSession{}, &httpError{Status: http.StatusServiceUnavailable, Code: "driver_unavailable", Message: pluginError(err)}
		}
		return db.SetupSession{}, err
	}
	var sess db.SetupSession
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		env, err := db.LockEnvironment(ctx, tx, a.Company.ID, env.ID)
		if err != nil {
			return err
		}
		if env.Status != db.EnvironmentActive {
			return &httpError{Status: http.StatusConflict, Code: "environment_archived", Message: "The environment is archived."}
		}
		active, err := db.ActiveImageVersion(ctx, tx, a.Company.ID, env.ID)
		if errors.Is(err, db.ErrNotFound) {
			return &httpError{Status: http.StatusConflict, Code: "no_image_version",
				Message: "The environment has no active image version: import an image first."}
		}
		if err != nil {
			return err
		}
		sess, err = db.CreateSetupSession(ctx, tx, db.NewSetupSession{CompanyID: a.Company.ID, EnvironmentID: env.ID,
			BaseVersion: active.Number, UserID: a.P.User.ID, TTL: ttl, NodeID: s.nodes.self()})
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "setup_session_live",
				Message: "This environment already has a live setup session: finish or cancel it first."}
		}
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "image_setup_session.started", "image_setup_session", sess.ID,
			map[string]any{"environment_id": env.ID, "base_version": active.Number, "ttl_s": int(ttl.Seconds()), "plugin": env.Name})
	})
	if err != nil {
		return db.SetupSession{}, err
	}
	failed := func(cause error) (db.SetupSession, error) {
		bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), pluginTerminalOpen)
		defer cancel()
		is.Terminals.Close(sess.ID, terminal.ReasonCancelled)
		if cur, err := db.SetupSessionByID(bg, s.pool, sess.CompanyID, sess.ID); err == nil {
			_ = jobs.ReleaseSetupInstance(bg, s.pluginDeps(), cur)
		}
		_, _ = db.MoveSetupSession(bg, s.pool, sess.CompanyID, sess.ID, []string{db.SetupStarting}, db.SetupFailed, pluginError(cause))
		return db.SetupSession{}, fmt.Errorf("start setup session: %w", cause)
	}
	rt, inst, err := jobs.AcquireSetupInstance(ctx, s.pluginDeps(), env, sess)
	if err != nil {
		return failed(err)
	}
	if err := is.Sessions.Open(ctx, pluginShell(sess, rt, inst)); err != nil {
		return failed(err)
	}
	sess, err = db.MoveSetupSession(ctx, s.pool, sess.CompanyID, sess.ID, []string{db.SetupStarting}, db.SetupWaitingForUser, "")
	if err != nil {
		return failed(err)
	}
	return sess, nil
}

// pluginShell is a plugin environment's session as this node runs it: the plugin's terminal on
// the session's instance.
func pluginShell(sess db.SetupSession, rt environment.RemoteTerminals, inst environment.Instance) imagesetup.Session {
	sh := setupShell(sess, environment.SandboxConfig{})
	sh.Remote = &imagesetup.Remote{Terminals: rt, Instance: inst}
	return sh
}

// pluginAttach is the Attach of a plugin environment's session: its terminal on the instance the
// session recorded.
func (s *Server) pluginAttach(ctx context.Context, env db.Environment, sess db.SetupSession) (terminal.Attach, error) {
	inst, ok := environment.RemoteInstance(sess.ProviderRef)
	if !ok || inst.Driver != environment.DriverPlugin || s.imageSetup == nil || s.imageSetup.Plugins == nil {
		return terminal.Attach{}, &terminal.Refusal{Message: "The setup session has no instance on this server."}
	}
	rt, err := jobs.SetupTerminals(ctx, s.pluginDeps(), env)
	if err != nil {
		return terminal.Attach{}, err
	}
	return s.imageSetup.Sessions.Attach(pluginShell(sess, rt, inst)), nil
}

// releasePluginSetup releases an ended session's plugin instance (nothing for other sessions).
func (s *Server) releasePluginSetup(ctx context.Context, sess db.SetupSession) {
	if sess.ProviderRef == "" || s.imageSetup == nil || s.imageSetup.Plugins == nil {
		return
	}
	bg, cancel := context.WithTimeout(context.WithoutCancel(ctx), pluginTerminalOpen)
	defer cancel()
	if err := jobs.ReleaseSetupInstance(bg, s.pluginDeps(), sess); err != nil {
		s.log.WarnContext(ctx, "release setup instance", "session_id", sess.ID, "err", err)
	}
}

// pluginError is a plugin failure as a session's error text: the message without the sentinel
// chain's repetition.
func pluginError(err error) string {
	msg := err.Error()
	if len(msg) > 1024 {
		msg = msg[:1024] + "…"
	}
	return msg
}
