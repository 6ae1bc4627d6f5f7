// Package static embeds Berth's front-end files and serves them under
// content-hashed URLs, so browsers may cache every response forever and a
// deploy changes the URL of each file whose content changed.
//
// The files in vendor/ come from npm; ./static/vendor.sh puts them there and
// the Makefile runs it before every build. On a fresh clone vendor/ holds only
// .gitkeep: the package still compiles, and URL panics for the missing names.
package static

import (
	"bytes"
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"mime"
	"net/http"
	"path"
	"strings"
	"time"
)

//go:embed css js favicon.svg all:vendor
var embedded embed.FS

// Prefix is the URL path under which Handler must be mounted.
const Prefix = "/static/"

// hashLen is how many hex characters of the SHA-256 go into a URL.
const hashLen = 10

// cacheControl lets browsers and proxies keep a response for a year without
// revalidating: a hashed URL never changes its content.
const cacheControl = "public, max-age=31536000, immutable"

// contentTypes pins the types of the files we ship instead of trusting the
// host's MIME tables.
var contentTypes = map[string]string{
	".css":   "text/css; charset=utf-8",
	".js":    "text/javascript; charset=utf-8",
	".mjs":   "text/javascript; charset=utf-8",
	".json":  "application/json",
	".svg":   "image/svg+xml",
	".png":   "image/png",
	".ico":   "image/x-icon",
	".woff2": "font/woff2",
}

// Assets serves the embedded front-end files under content-hashed URLs.
type Assets struct {
	byName   map[string]*asset // "css/app.css"
	byHashed map[string]*asset // "css/app.0123456789.css"
}

type asset struct {
	url         string // "/static/css/app.0123456789.css"
	etag        string // the hash, quoted
	contentType string
	body        []byte
}

// New hashes every embedded file once; call it at start-up and share the result.
func New() (*Assets, error) {
	return NewFS(embedded)
}

// NewFS is New over any file system, so tests can serve files they control.
// Files and directories whose names start with a dot are skipped.
func NewFS(fsys fs.FS) (*Assets, error) {
	a := &Assets{
		byName:   make(map[string]*asset),
		byHashed: make(map[string]*asset),
	}
	err := fs.WalkDir(fsys, ".", func(name string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if name != "." && strings.HasPrefix(d.Name(), ".") {
			if d.IsDir() {
				return fs.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() {
			return nil
		}
		body, err := fs.ReadFile(fsys, name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		hash := hex.EncodeToString(sum[:])[:hashLen]
		hashed := hashedName(name, hash)
		if _, dup := a.byHashed[hashed]; dup {
			return fmt.Errorf("%s: hashed name %s is taken", name, hashed)
		}
		as := &asset{
			url:         Prefix + hashed,
			etag:        `"` + hash + `"`,
			contentType: contentType(name),
			body:        body,
		}
		a.byName[name] = as
		a.byHashed[hashed] = as
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("hash static assets: %w", err)
	}
	return a, nil
}

// hashedName puts the hash before the extension: "css/app.css" becomes
// "css/app.<hash>.css", "vendor/htmx.min.js" becomes "vendor/htmx.min.<hash>.js".
func hashedName(name, hash string) string {
	ext := path.Ext(name)
	if ext == "" || ext == path.Base(name) {
		return name + "." + hash
	}
	return strings.TrimSuffix(name, ext) + "." + hash + ext
}

func contentType(name string) string {
	ext := strings.ToLower(path.Ext(name))
	if ct, ok := contentTypes[ext]; ok {
		return ct
	}
	if ct := mime.TypeByExtension(ext); ct != "" {
		return ct
	}
	return "application/octet-stream"
}

// Has reports whether name (a path such as "css/app.css") is an embedded asset.
func (a *Assets) Has(name string) bool {
	_, ok := a.byName[name]
	return ok
}

// URL returns the hashed URL of name, e.g. "css/app.css" ->
// "/static/css/app.<hash>.css". An unknown name is a programming error, so it
// panics; the tests that render every page catch it.
func (a *Assets) URL(name string) string {
	as, ok := a.byName[name]
	if !ok {
		if strings.HasPrefix(name, "vendor/") {
			panic(fmt.Sprintf("static: unknown asset %q (run ./static/vendor.sh)", name))
		}
		panic(fmt.Sprintf("static: unknown asset %q", name))
	}
	return as.url
}

// Handler serves the assets under their hashed names. Mount it at Prefix
// ("/static/"), as is or behind http.StripPrefix("/static", ...): it accepts
// "/static/css/app.<hash>.css" and "/css/app.<hash>.css" alike. Only the
// current hashed name of a file is served; plain, stale and unknown names get
// 404 so an old page never receives content it was not built against.
func (a *Assets) Handler() http.Handler {
	return http.HandlerFunc(a.serve)
}

func (a *Assets) serve(w http.ResponseWriter, r *http.Request) {
	h := w.Header()
	h.Set("X-Content-Type-Options", "nosniff")
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		h.Set("Allow", "GET, HEAD")
		http.Error(w, http.StatusText(http.StatusMethodNotAllowed), http.StatusMethodNotAllowed)
		return
	}
	name, ok := strings.CutPrefix(r.URL.Path, Prefix)
	if !ok {
		name, ok = strings.CutPrefix(r.URL.Path, "/")
	}
	as := a.byHashed[name]
	if !ok || as == nil {
		http.NotFound(w, r)
		return
	}
	h.Set("Cache-Control", cacheControl)
	h.Set("Content-Type", as.contentType)
	h.Set("ETag", as.etag)
	// ServeContent answers If-None-Match with 304, HEAD without a body, and Range.
	http.ServeContent(w, r, name, time.Time{}, bytes.NewReader(as.body))
}
