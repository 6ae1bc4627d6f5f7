package handlers

import (
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"berth/db"
	"berth/views"
)

// loginPage shows the sign-in form, or sends a signed-in browser to the dashboard.
func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) error {
	if p := principalFrom(r.Context()); p != nil && p.Via == "session" {
		http.Redirect(w, r, "/", http.StatusSeeOther)
		return nil
	}
	return s.render(w, r, views.LoginPage(s.frame(r, "Sign in", ""), views.LoginForm{}))
}

// loginForm is the sign-in form's fields.
type loginForm struct {
	Email    string
	Password string
}

func (f loginForm) validate() string {
	switch {
	case f.Email == "" || f.Password == "":
		return "Enter your email and password."
	case len(f.Email) > 254 || len(f.Password) > 1024:
		return "Email or password is too long."
	}
	return ""
}

// login checks the credentials. Failure re-renders the form with one message for every cause (no
// hint which emails exist), creates no session and is audited. Repeated failures are slowed down,
// never locked out (LoginLimit): while a wait is due the answer is 429 with Retry-After before the
// password is checked. Success renews the session token (against fixation) and redirects to the
// dashboard.
func (s *Server) login(w http.ResponseWriter, r *http.Request) error {
	r.Body = http.MaxBytesReader(w, r.Body, 64<<10)
	if err := r.ParseForm(); err != nil {
		return badRequest("bad_form", "The form could not be read.")
	}
	f := loginForm{Email: db.NormalizeEmail(r.PostForm.Get("email")), Password: r.PostForm.Get("password")}
	fail := func(status int, msg string) error {
		return s.renderStatus(w, r, status, views.LoginPage(s.frame(r, "Sign in", ""), views.LoginForm{Email: f.Email, Error: msg}))
	}
	if msg := f.validate(); msg != "" {
		return fail(http.StatusBadRequest, msg)
	}
	ctx := r.Context()
	ip := clientIP(r)

	failures, err := db.RecentLoginFailureState(ctx, s.pool, f.Email, ip, s.limit.Window)
	if err != nil {
		return err
	}
	if wait := s.limit.loginWait(failures); wait > 0 {
		secs := retryAfterSeconds(wait)
		s.audit(ctx, r, nil, "", "login.rate_limited", "user", f.Email, map[string]any{"email": f.Email, "retry_after": secs})
		w.Header().Set("Retry-After", strconv.Itoa(secs))
		return fail(http.StatusTooManyRequests, fmt.Sprintf("Too many failed sign-ins. Try again in %d seconds.", secs))
	}

	u, err := db.UserByEmail(ctx, s.pool, f.Email)
	reason := ""
	switch {
	case errors.Is(err, db.ErrNotFound):
		db.CheckPasswordTiming(f.Password)
		reason = "unknown_email"
	case err != nil:
		return err
	case u.Disabled:
		db.CheckPasswordTiming(f.Password)
		reason = "disabled"
	default:
		if err := db.CheckPassword(u.PasswordHash, f.Password); errors.Is(err, db.ErrBadPassword) {
			reason = "bad_password"
		} else if err != nil {
			return err
		}
	}
	if reason != "" {
		if err := db.RecordLoginAttempt(ctx, s.pool, f.Email, ip, false); err != nil {
			return err
		}
		s.audit(ctx, r, nil, "", "login.failed", "user", f.Email, map[string]any{"email": f.Email, "reason": reason})
		return fail(http.StatusUnauthorized, "Email or password is incorrect.")
	}

	if err := s.sessions.RenewToken(ctx); err != nil {
		return err
	}
	s.sessions.Put(ctx, sessionUserKey, u.ID)
	s.sessions.Put(ctx, db.SessionAgentKey, r.UserAgent()) // the settings page's "signed in with"
	if err := db.RecordLoginAttempt(ctx, s.pool, f.Email, ip, true); err != nil {
		return err
	}
	s.audit(ctx, r, &principal{User: u}, "", "login.succeeded", "user", u.ID, nil)
	http.Redirect(w, r, "/", http.StatusSeeOther)
	return nil
}

// logout destroys the session (row and cookie) and returns to the sign-in page.
func (s *Server) logout(w http.ResponseWriter, r *http.Request) error {
	p := principalFrom(r.Context())
	if err := s.sessions.Destroy(r.Context()); err != nil {
		return err
	}
	if p != nil {
		s.audit(r.Context(), r, p, "", "logout", "user", p.User.ID, nil)
	}
	if strings.HasPrefix(r.URL.Path, "/api/") {
		w.WriteHeader(http.StatusNoContent)
		return nil
	}
	http.Redirect(w, r, "/login", http.StatusSeeOther)
	return nil
}
