package handlers

import (
	"bufio"
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/gorilla/websocket"

	"berth/db"
	"berth/environment"
	"berth/terminal"
)

// The terminal of a setup session: minting terminal tokens and the WebSocket (docs/terminal.md).

// terminalTokenTTL is how long a minted terminal token may wait to be presented.
const terminalTokenTTL = 60 * time.Second

// apiMintTerminalToken is POST /api/image-setup-sessions/{id}/terminal-token (instance admins,
// session or API token): 201 {token, expires_at}. The token is shown once, never stored or logged.
func (s *Server) apiMintTerminalToken(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := emptyJSONBody(w, r); err != nil {
		return err
	}
	ctx := r.Context()
	id := r.PathValue("id")
	a, sess, err := s.sessionAccess(r, p, id, "terminal_token.mint")
	if err != nil {
		return err
	}
	if sess.Status != db.SetupWaitingForUser {
		return &httpError{Status: http.StatusConflict, Code: "setup_session_not_live",
			Message: "The setup session is not waiting for its user."}
	}
	token, hash := terminal.NewToken()
	exp, err := db.InsertTerminalToken(ctx, s.pool, hash, db.TerminalToken{CompanyID: a.Company.ID, SessionID: id,
		UserID: p.User.ID, EnvironmentID: sess.EnvironmentID}, terminalTokenTTL)
	if err != nil {
		return err
	}
	s.audit(ctx, r, p, a.Company.ID, "terminal_token.minted", "image_setup_session", id,
		map[string]any{"environment_id": sess.EnvironmentID, "expires_at": exp.UTC(), "via": p.Via})
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, map[string]any{"token": token, "expires_at": exp.UTC()})
	return nil
}

// terminalSocket is GET /api/image-setup-sessions/{id}/terminal, the WebSocket. A present Origin
// must be Berth's own (403 before the upgrade otherwise); no other credential is needed to
// upgrade: the first frame's token identifies the user, and every refusal is audited.
func (s *Server) terminalSocket(w http.ResponseWriter, r *http.Request) error {
	id := r.PathValue("id")
	if o := r.Header.Get("Origin"); o != "" && !strings.EqualFold(o, s.baseURL.Scheme+"://"+s.baseURL.Host) {
		ctx, cancel := background(r.Context())
		defer cancel()
		s.audit(ctx, r, nil, "", "terminal.origin_refused", "image_setup_session", auditText(id), map[string]any{"origin": auditText(o)})
		return errCrossOrigin
	}
	if done, err := s.forwardTerminal(w, r, id); done || err != nil { // its shell is on another node (preview_forward.go)
		return err
	}
	is := s.imageSetup
	if is == nil || is.Terminals == nil || (is.Jail == nil && is.Plugins == nil) {
		return errNotFound
	}
	up := websocket.Upgrader{ReadBufferSize: 32 << 10, WriteBufferSize: 32 << 10,
		CheckOrigin: func(*http.Request) bool { return true }} // checked above
	conn, err := up.Upgrade(hijacker{w}, r, nil)
	if err != nil {
		return nil // the upgrader has answered
	}
	ip := clientIP(r)
	_ = is.Terminals.Serve(context.WithoutCancel(r.Context()), conn, id, func(ctx context.Context, token string) (terminal.Attach, error) {
		return s.authorizeTerminal(ctx, ip, id, token)
	})
	return nil
}

// authorizeTerminal spends the presented token and admits its holder when the token was minted
// for this session by a user who is still an instance admin and the session still waits for
// its user. Every refusal is audited (without the token).
func (s *Server) authorizeTerminal(ctx context.Context, ip, id, token string) (terminal.Attach, error) {
	refuse := func(companyID, why, msg string) (terminal.Attach, error) {
		bg, cancel := background(ctx)
		defer cancel()
		s.auditAt(bg, ip, nil, companyID, "terminal_token.refused", "image_setup_session", auditText(id), map[string]any{"reason": why})
		return terminal.Attach{}, &terminal.Refusal{Message: msg}
	}
	hash, ok := terminal.HashToken(token)
	if !ok {
		return refuse("", "malformed", "The terminal token is not valid.")
	}
	t, err := db.ConsumeTerminalToken(ctx, s.pool, hash)
	if errors.Is(err, db.ErrTokenRefused) {
		return refuse("", "unknown, expired or already used", "The terminal token is not valid.")
	}
	if err != nil {
		return terminal.Attach{}, err
	}
	if !strings.EqualFold(t.SessionID, id) {
		return refuse(t.CompanyID, "minted for another session", "The terminal token is not valid for this session.")
	}
	u, err := db.UserByID(ctx, s.pool, t.UserID)
	if err != nil || !u.IsInstanceAdmin {
		return refuse(t.CompanyID, "the user is no longer an instance admin", "The terminal token is not valid.")
	}
	sess, err := db.SetupSessionByID(ctx, s.pool, t.CompanyID, id)
	if err != nil {
		return terminal.Attach{}, err
	}
	if sess.EnvironmentID != t.EnvironmentID {
		return refuse(t.CompanyID, "minted for another environment", "The terminal token is not valid for this session.")
	}
	if sess.Status != db.SetupWaitingForUser || !time.Now().Before(sess.ExpiresAt) {
		return refuse(t.CompanyID, "the session is "+sess.Status, "The setup session is not open.")
	}
	env, err := db.EnvironmentByID(ctx, s.pool, t.CompanyID, sess.EnvironmentID)
	if err != nil {
		return terminal.Attach{}, err
	}
	cfg, err := environment.Load(env.Driver, env.Config)
	if err != nil {
		return terminal.Attach{}, err
	}
	s.auditAt(ctx, ip, &principal{User: u, Via: "terminal_token"}, t.CompanyID, "terminal.attached", "image_setup_session", id,
		map[string]any{"environment_id": sess.EnvironmentID})
	if env.Driver == environment.DriverPlugin {
		return s.pluginAttach(ctx, env, sess)
	}
	return s.imageSetup.Sessions.Attach(setupShell(sess, cfg.Sandbox)), nil
}

// hijacker gives the WebSocket upgrader the connection under the middleware's response
// writers, which unwrap to it (http.ResponseController).
type hijacker struct{ http.ResponseWriter }

func (h hijacker) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	return http.NewResponseController(h.ResponseWriter).Hijack()
}
