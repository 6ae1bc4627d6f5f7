package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/environment"
	"berth/environment/jail"
	"berth/jobs"
	"berth/terminal"
	"berth/terminal/imagesetup"
)

// Image setup sessions (docs/terminal.md): an instance admin's shell in a setup jail over a
// scratch copy of a sandbox environment's active image layer. Start, read, finish (capture into
// the next version, by the capture_image job) and cancel; the terminal itself is in
// setup_sessions_terminal.go. The handlers move the session's state and audit it; the session's
// scratch layer, shell and transcript on this node are terminal/imagesetup's.

// ImageSetup is what setup sessions need on this node: the sessions' scratch layers, shells and
// transcripts (imagesetup.Sessions: the data dir, the jail host, the registry of live shells)
// and the plugin host.
type ImageSetup struct {
	imagesetup.Sessions
	// Plugins runs plugin environments' drivers: their sessions' terminals (setup_sessions_plugin.go).
	Plugins *environment.PluginHost
}

// setupShell is a sandbox environment's session as this node runs it: a shell in the setup jail
// of the environment's config over a scratch copy of the session's base version.
func setupShell(sess db.SetupSession, cfg environment.SandboxConfig) imagesetup.Session {
	return imagesetup.Session{ID: sess.ID, EnvironmentID: sess.EnvironmentID, BaseVersion: sess.BaseVersion,
		Expires: sess.ExpiresAt, Sandbox: cfg}
}

// Session ttl bounds (seconds).
const (
	defaultSetupTTL = 3600
	maxSetupTTL     = 86400
)

// setupSessionJSON is a setup session as the API returns it.
type setupSessionJSON struct {
	ID            string     `json:"id"`
	EnvironmentID string     `json:"environment_id"`
	Status        string     `json:"status"`
	BaseVersion   int        `json:"base_version"`
	ResultVersion *int       `json:"result_version"`
	ExpiresAt     time.Time  `json:"expires_at"`
	CreatedAt     time.Time  `json:"created_at"`
	FinishedAt    *time.Time `json:"finished_at"`
	Error         *string    `json:"error"`
	NodeID        *string    `json:"node_id"`
}

func setupSessionOut(s db.SetupSession) setupSessionJSON {
	out := setupSessionJSON{ID: s.ID, EnvironmentID: s.EnvironmentID, Status: s.Status, BaseVersion: s.BaseVersion,
		ExpiresAt: s.ExpiresAt.UTC(), CreatedAt: s.CreatedAt.UTC(), FinishedAt: utcPtr(s.FinishedAt), Error: optional(s.Error),
		NodeID: optional(s.NodeID)}
	if s.ResultVersion > 0 {
		n := s.ResultVersion
		out.ResultVersion = &n
	}
	return out
}

var errSetupUnavailable = &httpError{Status: http.StatusServiceUnavailable, Code: "environment_unavailable",
	Message: "Setup sessions need bubblewrap and the data dir on this server (" + jail.Fix + ")."}

// sessionAccess authorizes the caller for a setup session by id (instance admins only; members
// of its company get 403, everyone else 404) and loads it.
func (s *Server) sessionAccess(r *http.Request, p *principal, id, action string) (access, db.SetupSession, error) {
	ctx := r.Context()
	cid, err := db.SetupSessionCompany(ctx, s.pool, id)
	if err != nil {
		return access{}, db.SetupSession{}, err
	}
	a, err := s.companyAccess(ctx, p, cid)
	if err != nil {
		return access{}, db.SetupSession{}, err
	}
	if err := s.requireAdmin(r, a, action, "image_setup_session", id); err != nil {
		return access{}, db.SetupSession{}, err
	}
	sess, err := db.SetupSessionByID(ctx, s.pool, cid, id)
	return a, sess, err
}

// apiStartSetupSession is POST /api/environments/{id}/image-setup-sessions {ttl_s} (instance
// admins, sandbox environments): 201 with the session waiting for its user; a live session of
// the environment → 409.
func (s *Server) apiStartSetupSession(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "image_setup_session.start", "environment")
	if err != nil {
		return err
	}
	var b struct {
		TTLS *int `json:"ttl_s"`
	}
	if r.ContentLength != 0 {
		if err := decodeJSON(w, r, &b); err != nil {
			return err
		}
	}
	ttl := defaultSetupTTL
	if b.TTLS != nil {
		if *b.TTLS < 1 || *b.TTLS > maxSetupTTL {
			return invalid(map[string]string{"ttl_s": fmt.Sprintf("Between 1 and %d seconds.", maxSetupTTL)})
		}
		ttl = *b.TTLS
	}
	sess, err := s.startSetupSession(r, a, id, time.Duration(ttl)*time.Second)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusCreated, setupSessionOut(sess))
	return nil
}

// startSetupSession records the session, then has this node copy the active layer into its
// scratch layer and start its shell (imagesetup). A failure after the record leaves the session
// failed (the error's text in its row), its shell closed and its scratch dropped.
func (s *Server) startSetupSession(r *http.Request, a access, envID string, ttl time.Duration) (db.SetupSession, error) {
	ctx := r.Context()
	if env, ok := s.isPluginEnvironment(ctx, a.Company.ID, envID); ok {
		return s.startPluginSetupSession(r, a, env, ttl)
	}
	is := s.imageSetup
	if is == nil || is.Jail == nil || is.Data.Root == "" || is.Terminals == nil {
		return db.SetupSession{}, errSetupUnavailable
	}
	var sess db.SetupSession
	var cfg environment.SandboxConfig
	err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		env, err := db.LockEnvironment(ctx, tx, a.Company.ID, envID)
		if err != nil {
			return err
		}
		if env.Driver != environment.DriverSandbox {
			return &httpError{Status: http.StatusConflict, Code: "not_sandbox", Message: "Only sandbox environments have images."}
		}
		if env.Status != db.EnvironmentActive {
			return &httpError{Status: http.StatusConflict, Code: "environment_archived", Message: "The environment is archived."}
		}
		c, err := environment.Load(env.Driver, env.Config)
		if err != nil {
			return err
		}
		cfg = c.Sandbox
		active, err := db.ActiveImageVersion(ctx, tx, a.Company.ID, envID)
		if err != nil {
			return err
		}
		sess, err = db.CreateSetupSession(ctx, tx, db.NewSetupSession{CompanyID: a.Company.ID, EnvironmentID: envID,
			BaseVersion: active.Number, UserID: a.P.User.ID, TTL: ttl, NodeID: s.nodes.self()})
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "setup_session_live",
				Message: "This environment already has a live setup session: finish or cancel it first."}
		}
		if err != nil {
			return err
		}
		return s.auditTx(ctx, tx, r, a, "image_setup_session.started", "image_setup_session", sess.ID,
			map[string]any{"environment_id": envID, "base_version": active.Number, "ttl_s": int(ttl.Seconds()),
				"network": cfg.SetupNetwork})
	})
	if err != nil {
		return db.SetupSession{}, err
	}
	failed := func(cause error) (db.SetupSession, error) {
		bg, cancel := background(ctx)
		defer cancel()
		is.Terminals.Close(sess.ID, terminal.ReasonCancelled)
		jobs.RemoveSetupFiles(is.Data, sess)
		_, _ = db.MoveSetupSession(bg, s.pool, sess.CompanyID, sess.ID, []string{db.SetupStarting}, db.SetupFailed, cause.Error())
		return db.SetupSession{}, fmt.Errorf("start setup session: %w", cause)
	}
	// The copy of the layer runs after the transaction: no lock is held while it takes its time.
	if err := is.Sessions.Open(ctx, setupShell(sess, cfg)); err != nil {
		return failed(err)
	}
	sess, err = db.MoveSetupSession(ctx, s.pool, sess.CompanyID, sess.ID, []string{db.SetupStarting}, db.SetupWaitingForUser, "")
	if err != nil {
		return failed(err)
	}
	return sess, nil
}

// apiGetSetupSession is GET /api/image-setup-sessions/{id} (instance admins).
func (s *Server) apiGetSetupSession(w http.ResponseWriter, r *http.Request, p *principal) error {
	_, sess, err := s.sessionAccess(r, p, r.PathValue("id"), "image_setup_session.read")
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, setupSessionOut(sess))
	return nil
}

// apiFinishSetupSession is POST /api/image-setup-sessions/{id}/finish: 202 capturing; the shell
// ends (its client gets closed {reason:"setup_finished"}) and capture_image makes the version.
func (s *Server) apiFinishSetupSession(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	sess, err := s.endSetupSession(r, p, r.PathValue("id"), true)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, setupSessionOut(sess))
	return nil
}

// apiCancelSetupSession is POST /api/image-setup-sessions/{id}/cancel: 202 cancelled; the
// scratch layer is dropped and the active version is unchanged.
func (s *Server) apiCancelSetupSession(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	sess, err := s.endSetupSession(r, p, r.PathValue("id"), false)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusAccepted, setupSessionOut(sess))
	return nil
}

// endSetupSession finishes (capture) or cancels a session waiting for its user. The shell is
// ended inside the transaction that moves the session, so the capture never reads a layer that
// is still being written; a session in another state → 409.
func (s *Server) endSetupSession(r *http.Request, p *principal, id string, finish bool) (db.SetupSession, error) {
	ctx := r.Context()
	action, to, reason := "image_setup_session.cancelled", db.SetupCancelled, terminal.ReasonCancelled
	if finish {
		action, to, reason = "image_setup_session.finished", db.SetupCapturing, terminal.ReasonFinished
	}
	a, sess, err := s.sessionAccess(r, p, id, action)
	if err != nil {
		return db.SetupSession{}, err
	}
	if finish && s.jobs == nil {
		return db.SetupSession{}, errSetupUnavailable
	}
	if _, ok := s.isPluginEnvironment(ctx, a.Company.ID, sess.EnvironmentID); ok && finish {
		return db.SetupSession{}, errCaptureUnsupported
	}
	err = db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		sess, err = db.MoveSetupSession(ctx, tx, a.Company.ID, id, []string{db.SetupWaitingForUser, db.SetupStarting}, to, "")
		if errors.Is(err, db.ErrConflict) {
			return &httpError{Status: http.StatusConflict, Code: "setup_session_not_live",
				Message: "The setup session is not waiting for its user any more."}
		}
		if err != nil {
			return err
		}
		if finish {
			if _, err := jobs.Enqueue(ctx, s.jobs, tx, jobs.CaptureImageArgs{CompanyID: a.Company.ID, SessionID: id}); err != nil {
				return fmt.Errorf("enqueue capture: %w", err)
			}
		}
		if err := s.auditTx(ctx, tx, r, a, action, "image_setup_session", id,
			map[string]any{"environment_id": sess.EnvironmentID, "base_version": sess.BaseVersion}); err != nil {
			return err
		}
		if s.imageSetup != nil && s.imageSetup.Terminals != nil {
			s.imageSetup.Terminals.Close(id, reason)
		}
		return nil
	})
	if err != nil {
		return db.SetupSession{}, err
	}
	if !finish && s.imageSetup != nil {
		jobs.RemoveSetupFiles(s.imageSetup.Data, sess)
		s.releasePluginSetup(ctx, sess)
	}
	return sess, nil
}
