package handlers

import (
	"context"
	"errors"
	"net/http"
	"time"

	"berth/db"
	"berth/environment"
	"berth/views"
)

// The setup session page and its forms.

// liveSetupSessionID is the id of the environment's live setup session, "" when none.
func (s *Server) liveSetupSessionID(ctx context.Context, companyID, envID string) (string, error) {
	sess, err := db.LiveSetupSession(ctx, s.pool, companyID, envID)
	if errors.Is(err, db.ErrNotFound) {
		return "", nil
	}
	return sess.ID, err
}

// startSetupSessionForm is the environment page's "Start setup session": it starts a session
// with the default ttl and opens its page.
func (s *Server) startSetupSessionForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.adminObject(r, p, "environments", id, "image_setup_session.start", "environment")
	if err != nil {
		return err
	}
	if _, err := readForm(w, r, maxFormBody); err != nil {
		return err
	}
	sess, err := s.startSetupSession(r, a, id, defaultSetupTTL*time.Second)
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/image-setup-sessions/"+sess.ID)
	return nil
}

// endSetupSessionForm is the page's Finish (finish true) or Cancel button.
func (s *Server) endSetupSessionForm(finish bool) func(http.ResponseWriter, *http.Request, *principal) error {
	return func(w http.ResponseWriter, r *http.Request, p *principal) error {
		if _, err := readForm(w, r, maxFormBody); err != nil {
			return err
		}
		id := r.PathValue("id")
		if _, err := s.endSetupSession(r, p, id, finish); err != nil {
			return err
		}
		redirectAfterForm(w, r, "/image-setup-sessions/"+id)
		return nil
	}
}

// setupSessionPage is /image-setup-sessions/{id} (instance admins).
func (s *Server) setupSessionPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	r = s.live(r, "session", r.PathValue("id")) // the status follows the session (events_pages.go)
	a, sess, err := s.sessionAccess(r, p, r.PathValue("id"), "image_setup_session.read")
	if err != nil {
		return err
	}
	env, err := db.EnvironmentByID(r.Context(), s.pool, a.Company.ID, sess.EnvironmentID)
	if err != nil {
		return err
	}
	d := views.SetupSessionDetail{ID: sess.ID, EnvironmentID: env.ID, Environment: env.Name, Status: sess.Status,
		BaseVersion: sess.BaseVersion, ResultVersion: sess.ResultVersion, ExpiresAt: sess.ExpiresAt, Error: sess.Error,
		Live: sess.Status == db.SetupWaitingForUser, Plugin: env.Driver == environment.DriverPlugin,
		XtermJS: s.assets.URL("vendor/xterm.js"), XtermCSS: s.assets.URL("vendor/xterm.css"),
		FitJS: s.assets.URL("vendor/addon-fit.js"), TerminalJS: s.assets.URL("js/terminal.js")}
	return s.render(w, r, views.SetupSessionPage(s.companyFrame(r, a, "Setup session", "environments"), d))
}
