package handlers

import (
	"context"
	"errors"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"

	"berth/db"
	"berth/views"
)

// A person's own settings (/settings; docs/pages.md "Settings"): change the password, API tokens
// (create, list, revoke) and browser sessions (sign out the others). Every change is audited
// without a company (they are the person's, not a company's). The token routes also exist for
// scripts under /api/me/tokens; none of them accept a run token.

// tokenExpiryChoices are the lifetimes a new token may have, in days (0: never expires).
var tokenExpiryChoices = []int{30, 90, 365, 0}

// tokenInput is a new API token's fields.
type tokenInput struct {
	Name string
	Days int
}

func (in tokenInput) validate() map[string]string {
	errs := map[string]string{}
	switch n := strings.TrimSpace(in.Name); {
	case n == "":
		errs["name"] = "Name the token after what will use it (\"CI\", \"laptop script\")."
	case len(n) > 200:
		errs["name"] = "At most 200 characters."
	}
	ok := false
	for _, d := range tokenExpiryChoices {
		ok = ok || d == in.Days
	}
	if !ok {
		errs["expires"] = "Choose 30, 90 or 365 days, or never."
	}
	return errs
}

// createToken makes a user API token for p and returns it once (with its stored side).
func (s *Server) createToken(ctx context.Context, r *http.Request, p *principal, in tokenInput) (string, db.UserToken, error) {
	if errs := in.validate(); len(errs) > 0 {
		return "", db.UserToken{}, invalid(errs)
	}
	token, hash, err := db.NewToken()
	if err != nil {
		return "", db.UserToken{}, err
	}
	var expires *time.Time
	if in.Days > 0 {
		t := time.Now().Add(time.Duration(in.Days) * 24 * time.Hour).UTC()
		expires = &t
	}
	t, err := db.CreateUserTokenExpiring(ctx, s.pool, p.User.ID, strings.TrimSpace(in.Name), hash, expires)
	if err != nil {
		return "", db.UserToken{}, err
	}
	s.audit(ctx, r, p, "", "api_token.created", "api_token", t.ID, map[string]any{"name": t.Name, "expires_days": in.Days})
	return token, t, nil
}

// revokeToken revokes one of p's tokens (another's is the same 404 as a missing one).
func (s *Server) revokeToken(ctx context.Context, r *http.Request, p *principal, id string) (db.UserToken, error) {
	t, err := db.RevokeUserToken(ctx, s.pool, p.User.ID, id)
	if err != nil {
		return db.UserToken{}, err
	}
	s.audit(ctx, r, p, "", "api_token.revoked", "api_token", t.ID, map[string]any{"name": t.Name})
	return t, nil
}

// settingsPage is GET /settings.
func (s *Server) settingsPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	return s.renderSettings(w, r, p, http.StatusOK, views.SettingsForms{})
}

// renderSettings renders the settings page with the forms' state (a refusal in place, a new
// token shown once).
func (s *Server) renderSettings(w http.ResponseWriter, r *http.Request, p *principal, status int, forms views.SettingsForms) error {
	ctx := r.Context()
	if forms.TokenErrors == nil {
		forms.TokenDays = 90 // the default lifetime of a new token
	}
	tokens, err := db.UserTokens(ctx, s.pool, p.User.ID)
	if err != nil {
		return err
	}
	sessions, err := db.UserSessions(ctx, s.pool, p.User.ID, s.sessions.Token(ctx))
	if err != nil {
		return err
	}
	ms, err := db.UserMemberships(ctx, s.pool, p.User.ID)
	if err != nil {
		return err
	}
	v := views.SettingsData{Email: p.User.Email, IsAdmin: p.User.IsInstanceAdmin, Forms: forms, MinPassword: db.MinPasswordLen}
	for _, m := range ms {
		v.Memberships = append(v.Memberships, views.SettingsMembership{CompanyID: m.CompanyID, Name: m.CompanyName, Role: m.Role})
	}
	now := time.Now()
	for _, t := range tokens {
		row := views.TokenRow{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt, ExpiresAt: t.ExpiresAt, LastUsedAt: t.LastUsedAt}
		switch {
		case t.RevokedAt != nil:
			row.State = "revoked"
		case t.ExpiresAt != nil && !t.ExpiresAt.After(now):
			row.State = "expired"
		default:
			row.State = "active"
		}
		v.Tokens = append(v.Tokens, row)
	}
	for _, se := range sessions {
		v.Sessions = append(v.Sessions, views.SessionRow{ID: se.ID, CreatedAt: se.CreatedAt, Expiry: se.Expiry,
			Browser: views.BrowserName(se.UserAgent), UserAgent: se.UserAgent, Current: se.Current})
	}
	f := s.frame(r, "Settings", "settings")
	return s.renderStatus(w, r, status, views.SettingsPage(f, v))
}

// passwordInput is the change-password form.
type passwordInput struct {
	Current, New, Confirm string
}

func (in passwordInput) validate() map[string]string {
	errs := map[string]string{}
	if in.Current == "" {
		errs["current_password"] = "Enter your current password."
	}
	switch {
	case len(in.New) < db.MinPasswordLen:
		errs["new_password"] = "At least " + strconv.Itoa(db.MinPasswordLen) + " characters."
	case len(in.New) > 1024:
		errs["new_password"] = "At most 1024 characters."
	case in.New == in.Current:
		errs["new_password"] = "Choose a password other than the current one."
	}
	if in.Confirm != in.New {
		errs["confirm_password"] = "The two new passwords differ."
	}
	return errs
}

// changePasswordForm is POST /settings/password: the current password is checked (a wrong one
// is a 422 in place, audited, nothing changed); the new one replaces it, every other session of
// the user ends and this one gets a new token.
func (s *Server) changePasswordForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	in := passwordInput{Current: form.Get("current_password"), New: form.Get("new_password"), Confirm: form.Get("confirm_password")}
	refuse := func(errs map[string]string) error {
		return s.renderSettings(w, r, p, http.StatusUnprocessableEntity, views.SettingsForms{PasswordErrors: errs})
	}
	if errs := in.validate(); len(errs) > 0 {
		return refuse(errs)
	}
	ctx := r.Context()
	if err := db.CheckPassword(p.User.PasswordHash, in.Current); errors.Is(err, db.ErrBadPassword) {
		s.audit(ctx, r, p, "", "user.password_change.denied", "user", p.User.ID, map[string]any{"reason": "bad_password"})
		return refuse(map[string]string{"current_password": "That is not your current password."})
	} else if err != nil {
		return err
	}
	hash, err := db.HashPassword(in.New)
	if err != nil {
		return err
	}
	if err := db.InTx(ctx, s.pool, func(tx pgx.Tx) error {
		if err := db.UpdateUserCredentials(ctx, tx, p.User.ID, hash, false); err != nil {
			return err
		}
		n, err := db.DeleteOtherSessions(ctx, tx, p.User.ID, s.sessions.Token(ctx))
		if err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorUser, ActorID: p.User.ID, ActorLabel: p.User.Email,
			Action: "user.password_changed", TargetType: "user", TargetID: p.User.ID,
			Details: map[string]any{"sessions_ended": n}, IP: clientIP(r)})
	}); err != nil {
		return err
	}
	if err := s.sessions.RenewToken(ctx); err != nil {
		return err
	}
	redirectAfterForm(w, r, "/settings?flash=password_changed")
	return nil
}

// createTokenForm is POST /settings/tokens: the new token is shown once on the page it answers
// with (never in a URL, never again).
func (s *Server) createTokenForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	form, err := readForm(w, r, maxFormBody)
	if err != nil {
		return err
	}
	days, err := strconv.Atoi(form.Get("expires"))
	if err != nil {
		days = -1
	}
	in := tokenInput{Name: form.Get("name"), Days: days}
	token, t, err := s.createToken(r.Context(), r, p, in)
	if fields, ok := asValidation(err); ok {
		return s.renderSettings(w, r, p, http.StatusUnprocessableEntity,
			views.SettingsForms{TokenErrors: fields, TokenName: in.Name, TokenDays: in.Days})
	}
	if err != nil {
		return err
	}
	return s.renderSettings(w, r, p, http.StatusOK, views.SettingsForms{NewToken: token, NewTokenName: t.Name})
}

// revokeTokenForm is POST /settings/tokens/{id}/revoke.
func (s *Server) revokeTokenForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	if _, err := readForm(w, r, maxFormBody); err != nil {
		return err
	}
	if _, err := s.revokeToken(r.Context(), r, p, r.PathValue("id")); err != nil {
		return err
	}
	redirectAfterForm(w, r, "/settings?flash=token_revoked")
	return nil
}

// signOutOthersForm is POST /settings/sessions/sign-out-others: every other session of the user
// ends at once (their next request is signed out).
func (s *Server) signOutOthersForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	if _, err := readForm(w, r, maxFormBody); err != nil {
		return err
	}
	ctx := r.Context()
	n, err := db.DeleteOtherSessions(ctx, s.pool, p.User.ID, s.sessions.Token(ctx))
	if err != nil {
		return err
	}
	s.audit(ctx, r, p, "", "user.sessions_revoked", "user", p.User.ID, map[string]any{"sessions_ended": n})
	redirectAfterForm(w, r, "/settings?flash=sessions_revoked")
	return nil
}

// tokenJSON is one of the caller's tokens in /api/me/tokens.
type tokenJSON struct {
	ID         string     `json:"id"`
	Name       string     `json:"name"`
	CreatedAt  time.Time  `json:"created_at"`
	ExpiresAt  *time.Time `json:"expires_at"`
	LastUsedAt *time.Time `json:"last_used_at"`
	RevokedAt  *time.Time `json:"revoked_at"`
	Token      string     `json:"token,omitempty"` // only in the answer to its creation
}

func newTokenJSON(t db.UserToken) tokenJSON {
	return tokenJSON{ID: t.ID, Name: t.Name, CreatedAt: t.CreatedAt.UTC(), ExpiresAt: utcPtr(t.ExpiresAt),
		LastUsedAt: utcPtr(t.LastUsedAt), RevokedAt: utcPtr(t.RevokedAt)}
}

// myTokensAPI is GET /api/me/tokens: the caller's API tokens (never their values).
func (s *Server) myTokensAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	ts, err := db.UserTokens(r.Context(), s.pool, p.User.ID)
	if err != nil {
		return err
	}
	out := listResponse[tokenJSON]{Items: []tokenJSON{}}
	for _, t := range ts {
		out.Items = append(out.Items, newTokenJSON(t))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// createMyTokenAPI is POST /api/me/tokens {name, expires_in_days (30|90|365|0)} → 201 with the
// token, shown this once.
func (s *Server) createMyTokenAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	var in struct {
		Name          string `json:"name"`
		ExpiresInDays *int   `json:"expires_in_days"`
	}
	if err := decodeJSON(w, r, &in); err != nil {
		return err
	}
	days := 90
	if in.ExpiresInDays != nil {
		days = *in.ExpiresInDays
	}
	token, t, err := s.createToken(r.Context(), r, p, tokenInput{Name: in.Name, Days: days})
	if err != nil {
		return err
	}
	out := newTokenJSON(t)
	out.Token = token
	writeJSON(w, http.StatusCreated, out)
	return nil
}

// revokeMyTokenAPI is POST /api/me/tokens/{id}/revoke → 200 with the revoked token.
func (s *Server) revokeMyTokenAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	t, err := s.revokeToken(r.Context(), r, p, r.PathValue("id"))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, newTokenJSON(t))
	return nil
}
