package handlers

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"net/http"
	"strings"

	"berth/db"
	"berth/handlers/preview"
	"berth/views"
)

// Previews on their own origin (DESIGN §14, docs/previews.md): package preview serves the
// preview origins; Berth's own origin only answers /preview/{id}/… with a redirect there (a
// single-use ticket for a signed-in member), or with its page saying why the service does not
// run. It never serves the service's bytes.

// previewKeyLabel is the purpose label of the preview cookie key: it signs nothing else.
const previewKeyLabel = "berth preview cookie signing v1"

// PreviewKey derives the preview cookie key from Berth's secret key.
func PreviewKey(secret []byte) []byte {
	m := hmac.New(sha256.New, secret)
	m.Write([]byte(previewKeyLabel))
	return m.Sum(nil)
}

// LocalServices is this node's runtime services (preview.LocalServices).
type LocalServices = preview.LocalServices

// initPreview builds the preview origins from d.
func (s *Server) initPreview(d Deps) error {
	key := d.PreviewKey
	if len(key) == 0 {
		key = make([]byte, 32)
		if _, err := rand.Read(key); err != nil {
			return err
		}
	}
	bind := d.PreviewBind
	if bind == "" {
		bind = s.baseURL.Hostname()
	}
	cfg := preview.Config{Pool: s.pool, Log: s.log, Auth: previewAuth{s}, Berth: s.baseURL, Domain: d.PreviewDomain,
		Ports: d.PreviewPorts, BindHost: bind, Key: key, Local: d.LocalServices, Dial: d.DialService,
		BerthCookies: []string{s.sessions.Cookie.Name}}
	if s.nodes != nil && len(s.nodes.Key) > 0 {
		cfg.RemoteNode = s.remoteNode
		cfg.Forward = s.forwardPreview
	}
	p, err := preview.New(cfg)
	if err != nil {
		return err
	}
	s.preview = p
	return nil
}

// previewAuth answers the preview origin's questions with Berth's own rules.
type previewAuth struct{ s *Server }

func (a previewAuth) Bearer(ctx context.Context, r *http.Request, token string) (preview.Viewer, error) {
	p, err := a.s.tokenPrincipal(ctx, r, db.HashToken(token))
	if err != nil {
		var he *httpError
		if errors.As(err, &he) && he.Status == http.StatusUnauthorized {
			return preview.Viewer{}, preview.ErrUnauthorized
		}
		return preview.Viewer{}, err
	}
	return viewerOf(p), nil
}

func (a previewAuth) User(ctx context.Context, id string) (preview.Viewer, error) {
	u, err := db.UserByID(ctx, a.s.pool, id)
	if errors.Is(err, db.ErrNotFound) || err == nil && u.Disabled {
		return preview.Viewer{}, preview.ErrUnauthorized
	}
	if err != nil {
		return preview.Viewer{}, err
	}
	return preview.Viewer{UserID: u.ID}, nil
}

func (a previewAuth) Allowed(ctx context.Context, v preview.Viewer, svc db.RuntimeService) error {
	if v.RunID != "" {
		if v.RunCompanyID != svc.CompanyID || v.RunWorkspaceID != svc.ExecutionWorkspaceID {
			return db.ErrNotFound
		}
		return nil
	}
	_, role, err := db.CompanyRole(ctx, a.s.pool, svc.CompanyID, v.UserID)
	if err != nil {
		return err
	}
	if role == "" {
		return db.ErrNotFound // instance admins who are not members see no previews
	}
	return nil
}

// viewerOf is a principal as the preview origin knows it.
func viewerOf(p *principal) preview.Viewer {
	if p.Run != nil {
		return preview.Viewer{RunID: p.Run.ID, RunCompanyID: p.Run.Company.ID, RunWorkspaceID: p.Run.WorkspaceID}
	}
	return preview.Viewer{UserID: p.User.ID}
}

// previewRedirect is GET /preview/{id}/… on Berth's origin: a member of the service's company
// (any role) is sent to the preview origin with a fresh ticket, to the path asked for (or
// ?next=, a path of the preview origin); a run token is sent to the preview URL (its bearer
// token works there). Without credentials a browser goes to /login and others get 401; anyone
// else gets the same 404 as for a missing service. A service that does not run answers Berth's
// page saying why (503).
func (s *Server) previewRedirect(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	id := r.PathValue("id")
	p := principalFrom(ctx)
	if p == nil {
		if strings.Contains(r.Header.Get("Accept"), "text/html") {
			redirectToLogin(w, r)
			return nil
		}
		writeJSON(w, http.StatusUnauthorized, map[string]any{"error": map[string]string{
			"code": errUnauthorized.Code, "message": errUnauthorized.Message}})
		return nil
	}
	svc, err := db.RuntimeServiceForProxy(ctx, s.pool, id)
	if err != nil {
		return err
	}
	var canManage bool
	if p.Run != nil {
		if err := (previewAuth{s}).Allowed(ctx, viewerOf(p), svc); err != nil {
			return errNotFound
		}
	} else {
		a, err := s.companyAccess(ctx, p, svc.CompanyID)
		if err != nil || a.Role == "" {
			return errNotFound
		}
		canManage = a.canManage()
	}
	next := r.URL.Query().Get("next")
	if next != "" && (!strings.HasPrefix(next, "/") || strings.HasPrefix(next, "//") || strings.ContainsAny(next, "\\\r\n")) {
		next = "/" // a path of the preview origin, nothing else
	}
	if next == "" {
		rest := strings.TrimPrefix(strings.TrimPrefix(r.URL.Path, "/preview/"+id), "/")
		next = "/" + rest
		if !s.preview.Strip(ctx, svc) {
			next = "/preview/" + svc.ID + "/" + rest
		}
		if r.URL.RawQuery != "" {
			next += "?" + r.URL.RawQuery
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	if svc.Status != db.ServiceRunning || svc.Port == 0 {
		return s.previewUnavailable(w, r, canManage, svc)
	}
	if p.Run != nil {
		http.Redirect(w, r, strings.TrimSuffix(s.preview.URL(svc), "/")+next, http.StatusSeeOther)
		return nil
	}
	to, err := s.preview.MintTicket(ctx, svc, p.User.ID, next)
	if preview.ErrNoOrigin(err) {
		return &httpError{Status: http.StatusServiceUnavailable, Code: "preview_ports_exhausted",
			Message: "Every port of BERTH_PREVIEW_PORTS is in use by a running service; stop one or widen the range."}
	}
	if err != nil {
		return err
	}
	http.Redirect(w, r, to, http.StatusSeeOther)
	return nil
}

// previewUnavailable answers a preview whose service does not run: a Berth page for browsers, a
// JSON error otherwise; 503 either way.
func (s *Server) previewUnavailable(w http.ResponseWriter, r *http.Request, canManage bool, svc db.RuntimeService) error {
	if !strings.Contains(r.Header.Get("Accept"), "text/html") {
		return &httpError{Status: http.StatusServiceUnavailable, Code: "service_" + svc.Status,
			Message: "The preview's service is " + svc.Status + "."}
	}
	row := s.runtimeServiceRow(svc, canManage)
	return s.renderStatus(w, r, http.StatusServiceUnavailable,
		views.PreviewUnavailablePage(s.frame(r, "Preview "+svc.Name, ""), views.PreviewUnavailable{Service: row}))
}

// runtimeServiceRow is a service as the pages show it, with its absolute preview URL.
func (s *Server) runtimeServiceRow(svc db.RuntimeService, canControl bool) views.ServiceRow {
	return views.ServiceRow{ID: svc.ID, Name: svc.Name, Status: svc.Reported(), Health: svc.Health, Port: svc.Port,
		URL: s.preview.URL(svc), StopPolicy: svc.StopPolicy, StopReason: svc.StopReason, ExitCode: svc.ExitCode,
		LogExcerpt: svc.LogExcerpt, CanControl: canControl, WorkspaceID: svc.ExecutionWorkspaceID}
}

// stripBerthCookies removes Berth's session cookie from a request, keeping the service's own.
func stripBerthCookies(r *http.Request, name string) {
	cookies := r.Cookies()
	r.Header.Del("Cookie")
	for _, c := range cookies {
		if c.Name == name || c.Name == "berth_session" || c.Name == "__Host-berth_session" {
			continue
		}
		r.AddCookie(c)
	}
}
