package handlers

import (
	"net/http"
	"strings"
	"time"

	"berth/db"
	"berth/views"
)

// The command palette's search (Ctrl-K or / on every page; docs/pages.md "Search"). One query
// over the caller's companies (db.Search: company scoping is in its WHERE). htmx asks for the
// results fragment as the user types; without JavaScript /search is a page with a form; scripts
// use GET /api/search.

// searchHitJSON is one hit of GET /api/search.
type searchHitJSON struct {
	Kind        string    `json:"kind"`
	ID          string    `json:"id"`
	CompanyID   string    `json:"company_id"`
	CompanyName string    `json:"company_name"`
	Title       string    `json:"title"`
	Detail      string    `json:"detail"`
	URL         string    `json:"url"`
	At          time.Time `json:"at"`
}

// searchHitURL is the page a hit opens.
func searchHitURL(h db.SearchHit) string {
	switch h.Kind {
	case "project":
		return "/projects/" + h.ID
	case "task":
		return "/tasks/" + h.ID
	case "workspace":
		return "/workspaces/" + h.ID
	case "run":
		return "/runs/" + h.ID
	case "environment":
		return "/environments/" + h.ID
	}
	return "/"
}

// searchQuery reads ?q= (at most 200 characters are used).
func searchQuery(r *http.Request) string {
	return strings.TrimSpace(r.URL.Query().Get("q"))
}

// search runs the palette's search for p.
func (s *Server) search(r *http.Request, p *principal, q string) ([]db.SearchHit, error) {
	return db.Search(r.Context(), s.pool, p.User.ID, p.User.IsInstanceAdmin, q, db.SearchPerKind)
}

// searchAPI is GET /api/search?q=: the palette's hits as JSON (a user's session or API token).
func (s *Server) searchAPI(w http.ResponseWriter, r *http.Request, p *principal) error {
	hits, err := s.search(r, p, searchQuery(r))
	if err != nil {
		return err
	}
	out := struct {
		Items []searchHitJSON `json:"items"`
	}{Items: []searchHitJSON{}}
	for _, h := range hits {
		out.Items = append(out.Items, searchHitJSON{Kind: h.Kind, ID: h.ID, CompanyID: h.CompanyID, CompanyName: h.CompanyName,
			Title: h.Title, Detail: h.Detail, URL: searchHitURL(h), At: h.At.UTC()})
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// searchPage is GET /search?q=: the palette's results fragment for htmx, a page otherwise.
func (s *Server) searchPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	q := searchQuery(r)
	hits, err := s.search(r, p, q)
	if err != nil {
		return err
	}
	v := views.SearchResults{Query: q}
	for _, h := range hits {
		v.Hits = append(v.Hits, views.SearchHit{Kind: h.Kind, Title: h.Title, Detail: views.SearchDetail(h.Kind, h.Detail),
			Company: h.CompanyName, Href: searchHitURL(h)})
	}
	if htmxTarget(r, "palette-results") {
		return s.render(w, r, views.SearchResultsList(v))
	}
	f := s.frame(r, "Search", "")
	return s.render(w, r, views.SearchPage(f, v))
}
