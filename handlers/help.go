package handlers

import (
	"bufio"
	"bytes"
	"io/fs"
	"net/http"
	"path"
	"sort"
	"strings"
	"sync"

	"github.com/a-h/templ"
	"github.com/yuin/goldmark"
	"github.com/yuin/goldmark/extension"
	"github.com/yuin/goldmark/parser"

	"berth/docs"
	"berth/views"
)

// Help pages: the documentation in docs/ (embedded) rendered for the browser, so every page can
// link its own section (Frame.Help, "Help for this page" in the navigation). Headings get ids
// from their words ("## The layout check" → #the-layout-check). goldmark renders no raw HTML
// from the files (its default), so a page is only ever our Markdown; images come from
// docs/screenshots under /help/screenshots/.

var helpRender = goldmark.New(
	goldmark.WithExtensions(extension.GFM),
	goldmark.WithParserOptions(parser.WithAutoHeadingID()),
)

// helpDocs caches rendered documents (they are embedded: they never change while running).
type helpDocs struct {
	once  sync.Once
	pages map[string]views.HelpDoc
	index []views.HelpDoc
	err   error
}

var helpCache helpDocs

func (h *helpDocs) load() error {
	h.once.Do(func() {
		h.pages = map[string]views.HelpDoc{}
		names, err := fs.Glob(docs.Files, "*.md")
		if err != nil {
			h.err = err
			return
		}
		for _, n := range names {
			src, err := fs.ReadFile(docs.Files, n)
			if err != nil {
				h.err = err
				return
			}
			var out bytes.Buffer
			if err := helpRender.Convert(src, &out); err != nil {
				h.err = err
				return
			}
			name := strings.TrimSuffix(n, ".md")
			d := views.HelpDoc{Name: name, Title: helpTitle(src, name), HTML: out.String()}
			h.pages[name] = d
			h.index = append(h.index, views.HelpDoc{Name: d.Name, Title: d.Title})
		}
		sort.Slice(h.index, func(i, j int) bool { return h.index[i].Title < h.index[j].Title })
	})
	return h.err
}

// helpTitle is a document's first heading, or its name.
func helpTitle(src []byte, name string) string {
	sc := bufio.NewScanner(bytes.NewReader(src))
	for sc.Scan() {
		if t, ok := strings.CutPrefix(sc.Text(), "# "); ok {
			return strings.TrimSpace(t)
		}
	}
	return name
}

// helpIndex is GET /help: the list of documents.
func (s *Server) helpIndex(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := helpCache.load(); err != nil {
		return err
	}
	return s.render(w, r, views.HelpIndex(s.frame(r, "Help", "help"), helpCache.index))
}

// helpPage is GET /help/{name}: one document (404 for an unknown name).
func (s *Server) helpPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	if err := helpCache.load(); err != nil {
		return err
	}
	d, ok := helpCache.pages[r.PathValue("name")]
	if !ok {
		return errNotFound
	}
	return s.render(w, r, views.HelpPage(s.frame(r, d.Title, "help"), d, templ.Raw(d.HTML)))
}

// helpImage is GET /help/screenshots/{file}: a screenshot the documents show.
func (s *Server) helpImage(w http.ResponseWriter, r *http.Request, p *principal) error {
	name := path.Base(r.PathValue("file"))
	if !strings.HasSuffix(name, ".png") {
		return errNotFound
	}
	b, err := fs.ReadFile(docs.Files, "screenshots/"+name)
	if err != nil {
		return errNotFound
	}
	w.Header().Set("Content-Type", "image/png")
	w.Header().Set("Cache-Control", "private, max-age=3600")
	_, err = w.Write(b)
	return err
}

// helpSections maps a page's path to its section of the documentation: the first prefix that
// matches wins (longest ones first).
var helpSections = []struct{ prefix, help string }{
	{"/runs/", "/help/runs#flow"},
	{"/tasks/*/attempts", "/help/attempts"},
	{"/tasks/*/files", "/help/security#file-browser-and-git-internals"},
	{"/tasks/", "/help/decisions#tasks-plan-and-binding"},
	{"/projects/", "/help/decisions#projects-and-workspaces"},
	{"/project-workspaces/", "/help/decisions#projects-and-workspaces"},
	{"/workspaces/", "/help/runs#continuing-closing-reopening"},
	{"/companies/*/workspaces", "/help/runs#continuing-closing-reopening"},
	{"/companies/*/environments", "/help/decisions#environments"},
	{"/companies/*/members", "/help/decisions#tenancy-and-roles-docsapimd"},
	{"/companies/*/agents", "/help/security#run-tokens"},
	{"/companies/*/audit", "/help/security"},
	{"/companies/", "/help/decisions#projects-and-workspaces"},
	{"/environments/", "/help/decisions#environments"},
	{"/image-setup-sessions/", "/help/terminal#building-an-image-step-by-step"},
	{"/leases", "/help/runs#leases"},
	{"/admin/nodes", "/help/scaling"},
	{"/admin/workspaces", "/help/jobs"},
	{"/admin/source-roots", "/help/pages#local-repositories"},
	{"/settings", "/help/pages#settings"},
	{"/search", "/help/pages#search"},
}

// helpFor is the help link of the page at urlPath ("" for none: the help pages themselves).
// A "*" in a prefix stands for one path segment.
func helpFor(urlPath string) string {
	if urlPath == "/" {
		return "/help/pages"
	}
	for _, h := range helpSections {
		if helpMatch(urlPath, h.prefix) {
			return h.help
		}
	}
	return ""
}

func helpMatch(urlPath, prefix string) bool {
	before, after, wild := strings.Cut(prefix, "*")
	if !wild {
		return strings.HasPrefix(urlPath, prefix)
	}
	rest, ok := strings.CutPrefix(urlPath, before)
	if !ok {
		return false
	}
	i := strings.IndexByte(rest, '/')
	return i > 0 && strings.HasPrefix(rest[i:], after)
}
