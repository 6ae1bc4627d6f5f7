package handlers

import (
	"bytes"
	"net/http"

	"github.com/a-h/templ"

	"berth/views"
)

// frame is the page frame for the current request.
func (s *Server) frame(r *http.Request, title, active string) views.Frame {
	f := views.Frame{
		Title:   title,
		Active:  active,
		Version: s.version,
		Events:  liveFrom(r), // the page's /events URL when its handler made it live (events_pages.go)
		Help:    helpFor(r.URL.Path),
		Assets: views.AssetURLs{
			CSS:     s.assets.URL("css/app.css"),
			HTMX:    s.assets.URL("vendor/htmx.min.js"),
			SSE:     s.sseAsset(),
			App:     s.assets.URL("js/app.js"),
			Favicon: s.assets.URL("favicon.svg"),
			Theme:   s.assets.URL("js/theme.js"),
		},
	}
	if p := principalFrom(r.Context()); p != nil && p.Via == "session" {
		f.Email = p.User.Email
		f.IsAdmin = p.User.IsInstanceAdmin
	}
	if !isHTMX(r) || r.Header.Get("HX-History-Restore-Request") == "true" {
		f.Flash = views.FlashMessage(r.URL.Query().Get("flash")) // flash.go; fragments never show it
	}
	return f
}

// render writes a component with status 200.
func (s *Server) render(w http.ResponseWriter, r *http.Request, c templ.Component) error {
	return s.renderStatus(w, r, http.StatusOK, c)
}

// renderStatus renders into a buffer first, so a rendering error becomes a clean 500 instead of
// half a page.
func (s *Server) renderStatus(w http.ResponseWriter, r *http.Request, status int, c templ.Component) error {
	var buf bytes.Buffer
	if err := c.Render(r.Context(), &buf); err != nil {
		return err
	}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_, err := w.Write(buf.Bytes())
	return err
}

// companyFrame is the page frame for a page inside a company.
func (s *Server) companyFrame(r *http.Request, a access, title, active string) views.Frame {
	f := s.frame(r, title, active)
	f.Company = &views.CompanyNav{ID: a.Company.ID, Name: a.Company.Name, Slug: a.Company.Slug,
		Role: a.Role, CanManage: a.canManage(), IsAdmin: a.Admin}
	return f
}

// isHTMX reports whether the request comes from htmx and wants a fragment.
func isHTMX(r *http.Request) bool { return r.Header.Get("HX-Request") == "true" }

// htmxTarget reports whether an htmx request asks to swap the element with this id (and so
// wants that fragment, not the page; history restores ask for the page).
func htmxTarget(r *http.Request, id string) bool {
	return isHTMX(r) && r.Header.Get("HX-Target") == id && r.Header.Get("HX-History-Restore-Request") != "true"
}

// projectFrame is companyFrame for a page inside a project (its tasks are `g t` away).
func (s *Server) projectFrame(r *http.Request, a access, projectID, title string) views.Frame {
	f := s.companyFrame(r, a, title, "projects")
	f.ProjectID = projectID
	return f
}
