package handlers

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"berth/db"
)

// sessionUserKey is the session key holding the signed-in user's id (the session store reads it
// to record the session's owner, db.SessionUserKey).
const sessionUserKey = db.SessionUserKey

// principal is who is making a request: a user (by session or API token) or a run (by the run
// token its command was given). For a run, User is the zero User and Run is set.
type principal struct {
	User db.User
	Via  string // "session", "token" (a user's API token) or "run" (a run token)
	Run  *runPrincipal
}

// runPrincipal is a live run presenting its run token (docs/security.md "Run tokens"): it may reach
// its own task and its own execution workspace through the routes registered with runAPI, nothing
// else.
type runPrincipal struct {
	ID          string
	TaskID      string // "" when the run has no task any more
	WorkspaceID string // "" until the run has an execution workspace
	AgentID     string // "" for a run started by a person
	Company     db.Company
	ip          string // the caller's address, for audit events written without the request
}

// owns reports whether the row table/id is the run's own task, execution workspace or run.
func (rp *runPrincipal) owns(table, id string) bool {
	id = strings.ToLower(id)
	switch table {
	case "tasks":
		return rp.TaskID != "" && id == rp.TaskID
	case "execution_workspaces":
		return rp.WorkspaceID != "" && id == rp.WorkspaceID
	case "runs":
		return id == rp.ID
	}
	return false
}

// actor is how the principal is recorded on audit events: a user by id and email; a run as
// the agent it runs for (actor_id = the agent) or, started by a person, as "system" without an
// id; either way labelled "run <run id>" (audit_events allows user|agent|system|anonymous). No
// principal (nil) is "anonymous".
func (p *principal) actor() (actorType, id, label string) {
	switch {
	case p == nil:
		return db.ActorAnonymous, "", ""
	case p.Run != nil && p.Run.AgentID != "":
		return db.ActorAgent, p.Run.AgentID, "run " + p.Run.ID
	case p.Run != nil:
		return db.ActorSystem, "", "run " + p.Run.ID
	}
	return db.ActorUser, p.User.ID, p.User.Email
}

// errRunTokenEnded answers a run token whose run has ended (or that was revoked or expired).
var errRunTokenEnded = &httpError{Status: http.StatusUnauthorized, Code: "unauthorized",
	Message: "This run token is no longer valid: its run has ended, or the token was revoked or expired."}

// errRunTokenForbidden answers a run token on a route or object outside its scope.
var errRunTokenForbidden = &httpError{Status: http.StatusForbidden, Code: "forbidden",
	Message: "A run token may only read its own task, plan, binding, workspace, files and run, change its workspace's files and services, and select its binding."}

func principalFrom(ctx context.Context) *principal {
	p, _ := ctx.Value(principalKey).(*principal)
	return p
}

// identify resolves the caller from a bearer token or the session. A malformed or unknown token
// is a 401 for the API (never a silent fallback to the cookie), and a session whose user was
// disabled or deleted is destroyed.
func (s *Server) identify(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ctx := r.Context()
		if authz := r.Header.Get("Authorization"); authz != "" {
			token, ok := strings.CutPrefix(authz, "Bearer ")
			token = strings.TrimSpace(token)
			if !ok || token == "" {
				s.renderError(w, r, errUnauthorized)
				return
			}
			hash := db.HashToken(token)
			resolve := func() (*principal, error) { return s.tokenPrincipal(ctx, r, hash) }
			p, err := resolve()
			if p != nil && p.Run != nil {
				p.Run.ip = clientIP(r)
			}
			if err != nil {
				s.renderError(w, r, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, principalKey, p)))
			return
		}
		if id := s.sessions.GetString(ctx, sessionUserKey); id != "" {
			u, err := s.sessionUser(ctx, r, id)
			switch {
			case errors.Is(err, db.ErrNotFound) || err == nil && u.Disabled:
				if err := s.sessions.Destroy(ctx); err != nil {
					s.renderError(w, r, err)
					return
				}
			case err != nil:
				s.renderError(w, r, err)
				return
			default:
				ctx = context.WithValue(ctx, principalKey, &principal{User: u, Via: "session"})
			}
		}
		next.ServeHTTP(w, r.WithContext(ctx))
	})
}

// sessionUser is the user a session names.
func (s *Server) sessionUser(ctx context.Context, _ *http.Request, id string) (db.User, error) {
	return db.UserByID(ctx, s.pool, id)
}

// tokenPrincipal resolves a bearer token: a user token first (the common case costs one query),
// then a run token. Unknown, revoked and expired tokens are 401, and so is the token of a run
// that has ended.
func (s *Server) tokenPrincipal(ctx context.Context, r *http.Request, hash []byte) (*principal, error) {
	u, _, err := db.TokenUser(ctx, s.pool, hash)
	if err == nil {
		return &principal{User: u, Via: "token"}, nil
	}
	if !errors.Is(err, db.ErrNotFound) {
		return nil, err
	}
	rp, err := db.RunTokenPrincipal(ctx, s.pool, hash)
	switch {
	case errors.Is(err, db.ErrNotFound):
		return nil, errUnauthorized
	case err != nil:
		return nil, err
	case !rp.Live:
		return nil, errRunTokenEnded
	}
	return &principal{Via: "run", Run: &runPrincipal{ID: rp.RunID, TaskID: rp.TaskID, WorkspaceID: rp.WorkspaceID,
		AgentID: rp.AgentID, Company: rp.Company, ip: clientIP(r)}}, nil
}

// page wraps a browser page: without a session the browser goes to /login.
func (s *Server) page(fn func(http.ResponseWriter, *http.Request, *principal) error) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		p := principalFrom(r.Context())
		if p == nil || p.Via != "session" {
			redirectToLogin(w, r)
			return nil
		}
		return fn(w, r, p)
	})
}

// api wraps a JSON route that needs a signed-in user or a user's API token. A run token is
// refused with 403 (audited): only the routes registered with runAPI admit runs.
func (s *Server) api(fn func(http.ResponseWriter, *http.Request, *principal) error) http.Handler {
	return s.apiRoute(false, fn)
}

// runAPI wraps a JSON route that a run token may also call (the run-token list of
// docs/security.md). The handler must authorize through objectAccess (or companyAccess), which
// confines a run to its own task and execution workspace (see authz.go), and must use
// manageObjectOrRun, not manageObject, for a change a run may make.
func (s *Server) runAPI(fn func(http.ResponseWriter, *http.Request, *principal) error) http.Handler {
	return s.apiRoute(true, fn)
}

func (s *Server) apiRoute(admitRuns bool, fn func(http.ResponseWriter, *http.Request, *principal) error) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		p := principalFrom(r.Context())
		if p == nil {
			return errUnauthorized
		}
		if p.Run != nil && !admitRuns {
			s.auditRunDenied(r.Context(), p, "route", map[string]any{"method": r.Method, "route": r.Pattern, "path": auditText(r.URL.Path)})
			return errRunTokenForbidden
		}
		return fn(w, r, p)
	})
}

// audit records an event outside any transaction (sign-ins, refusals); changes record theirs
// inside their own transaction with db.InsertAudit. A failed audit write is logged, not fatal to
// a response that is already decided.
func (s *Server) audit(ctx context.Context, r *http.Request, p *principal, companyID, action, targetType, targetID string, details map[string]any) {
	s.auditAt(ctx, clientIP(r), p, companyID, action, targetType, targetID, details)
}

// auditAt is audit for callers without the request at hand: ip is the caller's address.
func (s *Server) auditAt(ctx context.Context, ip string, p *principal, companyID, action, targetType, targetID string, details map[string]any) {
	e := db.AuditEvent{CompanyID: companyID, Action: action, TargetType: targetType, TargetID: targetID,
		Details: details, IP: ip}
	e.ActorType, e.ActorID, e.ActorLabel = p.actor()
	if err := db.InsertAudit(ctx, s.pool, e); err != nil {
		s.log.ErrorContext(ctx, "audit write failed", "action", action, "err", err)
	}
}

// auditRunDenied records a run token refused on a route or an object outside its scope, as
// run_token.denied in the run's company with the run as target; why says which check refused.
func (s *Server) auditRunDenied(ctx context.Context, p *principal, why string, details map[string]any) {
	ctx, cancel := background(ctx)
	defer cancel()
	d := map[string]any{"check": why, "task_id": p.Run.TaskID}
	for k, v := range details {
		d[k] = v
	}
	s.auditAt(ctx, p.Run.ip, p, p.Run.Company.ID, "run_token.denied", "run", p.Run.ID, d)
}
