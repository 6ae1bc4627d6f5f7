package handlers

import (
	"context"
	"errors"
	"net/http"
	"strings"

	"berth/db"
)

// sessionUserKey is the session key holding the signed-in user's id.
const sessionUserKey = "user_id"

// principal is who is making a request.
type principal struct {
	User db.User
	Via  string // "session" or "token"
}

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
			u, _, err := db.TokenUser(ctx, s.pool, db.HashToken(token))
			if errors.Is(err, db.ErrNotFound) {
				s.renderError(w, r, errUnauthorized)
				return
			}
			if err != nil {
				s.renderError(w, r, err)
				return
			}
			next.ServeHTTP(w, r.WithContext(context.WithValue(ctx, principalKey, &principal{User: u, Via: "token"})))
			return
		}
		if id := s.sessions.GetString(ctx, sessionUserKey); id != "" {
			u, err := db.UserByID(ctx, s.pool, id)
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

// api wraps a JSON route that needs a signed-in user or an API token.
func (s *Server) api(fn func(http.ResponseWriter, *http.Request, *principal) error) http.Handler {
	return s.handle(func(w http.ResponseWriter, r *http.Request) error {
		p := principalFrom(r.Context())
		if p == nil {
			return errUnauthorized
		}
		return fn(w, r, p)
	})
}

// audit records an event outside any transaction (sign-ins, refusals); changes record theirs
// inside their own transaction with db.InsertAudit. A failed audit write is logged, not fatal to
// a response that is already decided.
func (s *Server) audit(ctx context.Context, r *http.Request, p *principal, companyID, action, targetType, targetID string, details map[string]any) {
	e := db.AuditEvent{
		CompanyID: companyID, ActorType: db.ActorAnonymous, Action: action,
		TargetType: targetType, TargetID: targetID, Details: details, IP: clientIP(r),
	}
	if p != nil {
		e.ActorType, e.ActorID, e.ActorLabel = db.ActorUser, p.User.ID, p.User.Email
	}
	if err := db.InsertAudit(ctx, s.pool, e); err != nil {
		s.log.ErrorContext(ctx, "audit write failed", "action", action, "err", err)
	}
}
