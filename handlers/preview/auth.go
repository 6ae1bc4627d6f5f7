package preview

import (
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/base64"
	"errors"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"berth/db"
)

// Signing in on a preview origin (docs/previews.md "Signing in on the preview origin"): Berth's
// origin mints a single-use ticket (≤ 60 s, sha256 at rest) for a member who opens a preview and
// sends the browser to TicketPath on the preview origin, which spends it and sets a cookie of
// its own: named for the service, HttpOnly, SameSite=Lax, no Domain (the preview origin's host
// only), signed with a key that signs nothing else. Berth's API never reads that cookie, and the
// preview origin never reads Berth's session cookie: the two cannot stand in for each other.

// TicketPath is the preview origin's path that exchanges a ticket for the cookie; the service
// never sees a request for it.
const TicketPath = "/__berth/preview-ticket"

// cookieTTL is a preview cookie's lifetime (Berth's session idle timeout).
const cookieTTL = 8 * time.Hour

// CookiePrefix starts every preview cookie's name; such cookies never reach a service.
const CookiePrefix = "berth_preview_"

// cookieName is service id's cookie (services on one host name share a cookie jar).
func cookieName(id string) string { return CookiePrefix + strings.ReplaceAll(id, "-", "") }

// cookieValue is "<user id>.<expiry unix>.<mac>" for service id.
func (p *Proxy) cookieValue(id, userID string, exp time.Time) string {
	e := strconv.FormatInt(exp.Unix(), 10)
	return userID + "." + e + "." + p.mac(id, userID, e)
}

func (p *Proxy) mac(id, userID, exp string) string {
	m := hmac.New(sha256.New, p.cfg.Key)
	m.Write([]byte(id + "\n" + userID + "\n" + exp))
	return base64.RawURLEncoding.EncodeToString(m.Sum(nil))
}

// cookieUser is the user service id's cookie on r names, if it is valid and may count: a
// request another origin's page made (a fetch, an XHR, a subresource) does not carry the
// viewer's standing, a top-level navigation does.
func (p *Proxy) cookieUser(r *http.Request, id string) (string, bool) {
	c, err := r.Cookie(cookieName(id))
	if err != nil || !sameOriginOrNavigation(r) {
		return "", false
	}
	parts := strings.Split(c.Value, ".")
	if len(parts) != 3 || !db.ValidID(parts[0]) {
		return "", false
	}
	exp, err := strconv.ParseInt(parts[1], 10, 64)
	if err != nil || time.Now().Unix() >= exp {
		return "", false
	}
	if !hmac.Equal([]byte(parts[2]), []byte(p.mac(id, parts[0], parts[1]))) {
		return "", false
	}
	return parts[0], true
}

// sameOriginOrNavigation reports whether r came from a page of its own origin, the address bar,
// or a top-level navigation (Sec-Fetch-Site where the browser sends it, else Origin).
func sameOriginOrNavigation(r *http.Request) bool {
	switch r.Header.Get("Sec-Fetch-Site") {
	case "", "same-origin", "none":
	default:
		if r.Header.Get("Sec-Fetch-Mode") != "navigate" {
			return false
		}
	}
	if o := r.Header.Get("Origin"); o != "" {
		u, err := url.Parse(o)
		if err != nil || !strings.EqualFold(u.Host, r.Host) {
			return r.Header.Get("Sec-Fetch-Mode") == "navigate" && r.Method == http.MethodGet
		}
	}
	return true
}

// viewer is who r acts for on service id's origin: a bearer token, else the service's preview
// cookie; ok false without either. A bad bearer token is an error (never a fallback to the
// cookie).
func (p *Proxy) viewer(r *http.Request, id string) (Viewer, bool, error) {
	ctx := r.Context()
	if authz := r.Header.Get("Authorization"); authz != "" {
		token, ok := strings.CutPrefix(authz, "Bearer ")
		token = strings.TrimSpace(token)
		if !ok || token == "" {
			return Viewer{}, false, ErrUnauthorized
		}
		v, err := p.cache.viewer(viewerKey{token: sha256.Sum256([]byte(token))}, func() (Viewer, error) {
			return p.cfg.Auth.Bearer(ctx, r, token)
		})
		return v, err == nil, err
	}
	userID, ok := p.cookieUser(r, id)
	if !ok {
		return Viewer{}, false, nil
	}
	v, err := p.cache.viewer(viewerKey{user: userID}, func() (Viewer, error) { return p.cfg.Auth.User(ctx, userID) })
	if errors.Is(err, ErrUnauthorized) {
		return Viewer{}, false, nil // a disabled or deleted user: sign in again
	}
	return v, err == nil, err
}

// MintTicket records a ticket for user to open svc and returns the preview origin URL that
// spends it and then shows next (a path on the preview origin). Berth's origin calls it for an
// authorized, signed-in viewer.
func (p *Proxy) MintTicket(ctx context.Context, svc db.RuntimeService, userID, next string) (string, error) {
	base, ok := p.origin(svc)
	if !ok {
		return "", errNoOrigin
	}
	token, hash, err := db.NewToken()
	if err != nil {
		return "", err
	}
	if err := db.CreatePreviewTicket(ctx, p.cfg.Pool, hash, db.PreviewTicket{CompanyID: svc.CompanyID,
		ServiceID: svc.ID, UserID: userID}, db.PreviewTicketTTL); err != nil {
		return "", err
	}
	q := url.Values{"t": {token}, "next": {safeNext(next)}}
	return base + TicketPath + "?" + q.Encode(), nil
}

// errNoOrigin: the service has no preview origin now (no port free, or not running).
var errNoOrigin = errors.New("preview: the service has no preview origin")

// ErrNoOrigin reports whether err means the service has no preview origin at the moment.
func ErrNoOrigin(err error) bool { return errors.Is(err, errNoOrigin) }

// safeNext keeps next a path of the same origin ("/" otherwise).
func safeNext(next string) string {
	if !strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/\\") ||
		strings.ContainsAny(next, "\r\n") {
		return "/"
	}
	return next
}

// exchange spends the ticket of a TicketPath request on service id's origin and sets the
// service's cookie; a bad, spent, expired or other service's ticket sets nothing and sends the
// browser to Berth to try again.
func (p *Proxy) exchange(w http.ResponseWriter, r *http.Request, id string) {
	w.Header().Set("Cache-Control", "no-store")
	w.Header().Set("Referrer-Policy", "no-referrer")
	token := r.URL.Query().Get("t")
	next := safeNext(r.URL.Query().Get("next"))
	if r.Method != http.MethodGet || token == "" {
		http.Error(w, "Not a preview ticket.", http.StatusBadRequest)
		return
	}
	t, err := db.ConsumePreviewTicket(r.Context(), p.cfg.Pool, db.HashToken(token))
	if err != nil || t.ServiceID != id {
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			p.cfg.Log.WarnContext(r.Context(), "preview ticket", "service_id", id, "err", err)
			http.Error(w, "The preview could not sign you in; try again.", http.StatusServiceUnavailable)
			return
		}
		writePage(w, http.StatusForbidden, "This preview link was already used or has expired.",
			p.berthPath(id, "/"), "Open the preview from Berth again")
		return
	}
	exp := time.Now().Add(cookieTTL)
	http.SetCookie(w, &http.Cookie{Name: cookieName(id), Value: p.cookieValue(id, t.UserID, exp), Path: "/",
		Expires: exp, MaxAge: int(cookieTTL / time.Second), HttpOnly: true, SameSite: http.SameSiteLaxMode,
		Secure: r.TLS != nil || p.cfg.Domain != "" && p.cfg.Berth.Scheme == "https"})
	http.Redirect(w, r, next, http.StatusSeeOther)
}

// berthPath is Berth's /preview/{id}/ for service id, asking to come back to next.
func (p *Proxy) berthPath(id, next string) string {
	u := strings.TrimSuffix(p.cfg.Berth.String(), "/") + "/preview/" + id + "/"
	if next = safeNext(next); next != "/" {
		u += "?" + url.Values{"next": {next}}.Encode()
	}
	return u
}
