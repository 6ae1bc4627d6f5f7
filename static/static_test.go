package static_test

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"testing/fstest"

	"berth/static"
)

// hash10 is the content hash the package is expected to use, computed independently.
func hash10(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])[:10]
}

const (
	cssBody   = "body{color:red}"
	jsBody    = "console.log(1)"
	htmxBody  = "/* htmx */"
	noExtBody = "plain"
)

func testFS() fstest.MapFS {
	return fstest.MapFS{
		"css/app.css":        {Data: []byte(cssBody)},
		"js/app.js":          {Data: []byte(jsBody)},
		"vendor/htmx.min.js": {Data: []byte(htmxBody)},
		"vendor/.gitkeep":    {Data: nil},
		"misc/LICENSE":       {Data: []byte(noExtBody)},
	}
}

func newTestAssets(t *testing.T) *static.Assets {
	t.Helper()
	a, err := static.NewFS(testFS())
	if err != nil {
		t.Fatalf("NewFS: %v", err)
	}
	return a
}

func TestURL(t *testing.T) {
	t.Parallel()
	a := newTestAssets(t)

	tests := []struct {
		name string
		want string
	}{
		{"css/app.css", "/static/css/app." + hash10(cssBody) + ".css"},
		{"js/app.js", "/static/js/app." + hash10(jsBody) + ".js"},
		{"vendor/htmx.min.js", "/static/vendor/htmx.min." + hash10(htmxBody) + ".js"},
		{"misc/LICENSE", "/static/misc/LICENSE." + hash10(noExtBody)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			if !a.Has(tt.name) {
				t.Fatalf("Has(%q) = false, want true", tt.name)
			}
			if got := a.URL(tt.name); got != tt.want {
				t.Fatalf("URL(%q) = %q, want %q", tt.name, got, tt.want)
			}
		})
	}
}

func TestURLUnknownPanics(t *testing.T) {
	t.Parallel()
	a := newTestAssets(t)

	for _, name := range []string{"css/missing.css", "vendor/.gitkeep", "/css/app.css", "app.css", ""} {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if a.Has(name) {
				t.Fatalf("Has(%q) = true, want false", name)
			}
			defer func() {
				if recover() == nil {
					t.Fatalf("URL(%q) did not panic", name)
				}
			}()
			_ = a.URL(name)
		})
	}
}

func TestHandler(t *testing.T) {
	t.Parallel()
	a := newTestAssets(t)
	h := a.Handler()
	cssURL := a.URL("css/app.css")
	jsURL := a.URL("js/app.js")
	cssETag := `"` + hash10(cssBody) + `"`

	const immutable = "public, max-age=31536000, immutable"
	tests := []struct {
		name       string
		method     string
		path       string
		header     map[string]string
		wantStatus int
		wantHeader map[string]string // "" means the header must be absent
		wantBody   string
	}{
		{
			name: "css", method: http.MethodGet, path: cssURL,
			wantStatus: http.StatusOK,
			wantHeader: map[string]string{
				"Content-Type":           "text/css; charset=utf-8",
				"Cache-Control":          immutable,
				"ETag":                   cssETag,
				"X-Content-Type-Options": "nosniff",
			},
			wantBody: cssBody,
		},
		{
			name: "js", method: http.MethodGet, path: jsURL,
			wantStatus: http.StatusOK,
			wantHeader: map[string]string{
				"Content-Type":  "text/javascript; charset=utf-8",
				"Cache-Control": immutable,
				"ETag":          `"` + hash10(jsBody) + `"`,
			},
			wantBody: jsBody,
		},
		{
			name: "vendor js", method: http.MethodGet, path: a.URL("vendor/htmx.min.js"),
			wantStatus: http.StatusOK,
			wantHeader: map[string]string{"Content-Type": "text/javascript; charset=utf-8"},
			wantBody:   htmxBody,
		},
		{
			name: "head", method: http.MethodHead, path: cssURL,
			wantStatus: http.StatusOK,
			wantHeader: map[string]string{
				"Content-Type":   "text/css; charset=utf-8",
				"Content-Length": "15",
				"ETag":           cssETag,
			},
			wantBody: "",
		},
		{
			name: "if-none-match hit", method: http.MethodGet, path: cssURL,
			header:     map[string]string{"If-None-Match": cssETag},
			wantStatus: http.StatusNotModified,
			wantHeader: map[string]string{"ETag": cssETag, "Cache-Control": immutable, "Content-Type": ""},
			wantBody:   "",
		},
		{
			name: "if-none-match list and weak", method: http.MethodGet, path: cssURL,
			header:     map[string]string{"If-None-Match": `"0000000000", W/` + cssETag},
			wantStatus: http.StatusNotModified,
		},
		{
			name: "if-none-match miss", method: http.MethodGet, path: cssURL,
			header:     map[string]string{"If-None-Match": `"0000000000"`},
			wantStatus: http.StatusOK,
			wantBody:   cssBody,
		},
		{
			name: "unhashed", method: http.MethodGet, path: "/static/css/app.css",
			wantStatus: http.StatusNotFound,
			wantHeader: map[string]string{"Cache-Control": "", "ETag": "", "X-Content-Type-Options": "nosniff"},
		},
		{name: "stale hash", method: http.MethodGet, path: "/static/css/app.0123456789.css", wantStatus: http.StatusNotFound},
		{
			name: "prefix stripped", method: http.MethodGet, path: strings.TrimPrefix(cssURL, "/static"),
			wantStatus: http.StatusOK,
			wantHeader: map[string]string{"Content-Type": "text/css; charset=utf-8", "ETag": cssETag},
			wantBody:   cssBody,
		},
		{name: "prefix stripped unhashed", method: http.MethodGet, path: "/css/app.css", wantStatus: http.StatusNotFound},
		{name: "double prefix", method: http.MethodGet, path: "/static" + cssURL, wantStatus: http.StatusNotFound},
		{name: "unknown", method: http.MethodGet, path: "/static/css/nope." + hash10(cssBody) + ".css", wantStatus: http.StatusNotFound},
		{name: "dotfile", method: http.MethodGet, path: "/static/vendor/.gitkeep." + hash10(""), wantStatus: http.StatusNotFound},
		{name: "root", method: http.MethodGet, path: "/static/", wantStatus: http.StatusNotFound},
		{name: "directory", method: http.MethodGet, path: "/static/css/", wantStatus: http.StatusNotFound},
		{name: "traversal", method: http.MethodGet, path: "/static/../static.go", wantStatus: http.StatusNotFound},
		{name: "traversal in dir", method: http.MethodGet, path: "/static/css/../../static/static.go", wantStatus: http.StatusNotFound},
		{name: "encoded traversal", method: http.MethodGet, path: "/static/css/..%2f..%2fstatic.go", wantStatus: http.StatusNotFound},
		{name: "dot segment before hashed", method: http.MethodGet, path: "/static/js/../" + strings.TrimPrefix(cssURL, "/static/"), wantStatus: http.StatusNotFound},
		{
			name: "post", method: http.MethodPost, path: cssURL,
			wantStatus: http.StatusMethodNotAllowed,
			wantHeader: map[string]string{"Allow": "GET, HEAD", "Cache-Control": ""},
		},
		{name: "put", method: http.MethodPut, path: cssURL, wantStatus: http.StatusMethodNotAllowed},
		{name: "delete unknown", method: http.MethodDelete, path: "/static/nope", wantStatus: http.StatusMethodNotAllowed},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			req := httptest.NewRequest(tt.method, tt.path, nil)
			for k, v := range tt.header {
				req.Header.Set(k, v)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			res := rec.Result()

			if res.StatusCode != tt.wantStatus {
				t.Fatalf("%s %s: status %d, want %d", tt.method, tt.path, res.StatusCode, tt.wantStatus)
			}
			for k, want := range tt.wantHeader {
				if got := res.Header.Get(k); got != want {
					t.Errorf("header %s = %q, want %q", k, got, want)
				}
			}
			body, err := io.ReadAll(res.Body)
			if err != nil {
				t.Fatalf("read body: %v", err)
			}
			if tt.wantStatus == http.StatusOK || tt.wantStatus == http.StatusNotModified {
				if string(body) != tt.wantBody {
					t.Errorf("body = %q, want %q", body, tt.wantBody)
				}
			} else if strings.Contains(string(body), cssBody) {
				t.Errorf("error response leaks file content: %q", body)
			}
		})
	}
}

// TestMountedOnMux checks the handler behind a real ServeMux, mounted as is and
// behind http.StripPrefix, including the mux's own path cleaning.
func TestMountedOnMux(t *testing.T) {
	t.Parallel()
	a := newTestAssets(t)
	mounts := map[string]http.Handler{
		"plain":       a.Handler(),
		"stripPrefix": http.StripPrefix("/static", a.Handler()),
	}
	for name, h := range mounts {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			testMounted(t, a, h)
		})
	}
}

func testMounted(t *testing.T, a *static.Assets, h http.Handler) {
	mux := http.NewServeMux()
	mux.Handle("GET "+static.Prefix, h)
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	client := srv.Client()
	client.CheckRedirect = func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }

	tests := []struct {
		path       string
		wantStatus int // 0: a redirect to /static.go
	}{
		{a.URL("css/app.css"), http.StatusOK},
		{"/static/css/app.css", http.StatusNotFound},
		{"/static/css/app.0123456789.css", http.StatusNotFound},
		{"/static/css/../../static.go", 0}, // the mux redirects to the clean /static.go, outside the handler
		{"/static.go", http.StatusNotFound},
	}
	for _, tt := range tests {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, srv.URL+tt.path, nil)
		if err != nil {
			t.Fatal(err)
		}
		req.URL.Opaque = tt.path // keep dot segments as sent
		res, err := client.Do(req)
		if err != nil {
			t.Fatalf("GET %s: %v", tt.path, err)
		}
		_ = res.Body.Close()
		if tt.wantStatus == 0 {
			if res.StatusCode < 300 || res.StatusCode > 399 || res.Header.Get("Location") != "/static.go" {
				t.Errorf("GET %s: status %d to %q, want a redirect to /static.go",
					tt.path, res.StatusCode, res.Header.Get("Location"))
			}
		} else if res.StatusCode != tt.wantStatus {
			t.Errorf("GET %s: status %d, want %d", tt.path, res.StatusCode, tt.wantStatus)
		}
	}
}

// vendorFiles are the names vendor.sh must produce; views refer to them by these names.
var vendorFiles = []string{
	"vendor/htmx.min.js",
	"vendor/xterm.js",
	"vendor/xterm.css",
	"vendor/addon-fit.js",
}

// TestEmbedded serves every shipped file from the real embedded FS and checks
// it against the file on disk.
func TestEmbedded(t *testing.T) {
	t.Parallel()
	a, err := static.New()
	if err != nil {
		t.Fatalf("New: %v", err)
	}
	names := []string{"css/app.css", "js/app.js"}

	js, err := filepath.Glob("vendor/*.js")
	if err != nil {
		t.Fatal(err)
	}
	if len(js) == 0 {
		t.Log("static/vendor has no .js files: run ./static/vendor.sh (the Makefile does); checking css/ and js/ only")
	} else {
		names = append(names, vendorFiles...)
	}

	h := a.Handler()
	hashed := regexp.MustCompile(`^/static/[a-z/.-]+\.[0-9a-f]{10}\.(css|js)$`)
	for _, name := range names {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			if !a.Has(name) {
				t.Fatalf("asset %q is not embedded", name)
			}
			want, err := os.ReadFile(filepath.FromSlash(name))
			if err != nil {
				t.Fatalf("read %s from disk: %v", name, err)
			}
			if len(want) == 0 {
				t.Fatalf("%s is empty", name)
			}
			url := a.URL(name)
			if !hashed.MatchString(url) {
				t.Fatalf("URL(%q) = %q, not a hashed static URL", name, url)
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, url, nil))
			if rec.Code != http.StatusOK {
				t.Fatalf("GET %s: status %d", url, rec.Code)
			}
			wantType := "text/javascript; charset=utf-8"
			if strings.HasSuffix(name, ".css") {
				wantType = "text/css; charset=utf-8"
			}
			if got := rec.Header().Get("Content-Type"); got != wantType {
				t.Errorf("Content-Type = %q, want %q", got, wantType)
			}
			if rec.Body.String() != string(want) {
				t.Errorf("served %s differs from the file on disk (stale embed?)", name)
			}
		})
	}
}

// TestVendor checks what vendor.sh produced: all four files, and the htmx major
// version the views are written for (a bare npm install would pull 4.x).
func TestVendor(t *testing.T) {
	t.Parallel()
	js, err := filepath.Glob("vendor/*.js")
	if err != nil {
		t.Fatal(err)
	}
	if len(js) == 0 {
		t.Skip("static/vendor has no .js files: run ./static/vendor.sh first (make does this before go test)")
	}
	for _, name := range vendorFiles {
		info, err := os.Stat(filepath.FromSlash(name))
		if err != nil {
			t.Errorf("vendor file missing: %v", err)
			continue
		}
		if info.Size() == 0 {
			t.Errorf("%s is empty", name)
		}
	}
	htmx, err := os.ReadFile(filepath.Join("vendor", "htmx.min.js"))
	if err != nil {
		t.Fatalf("read htmx: %v", err)
	}
	if !regexp.MustCompile(`version:"2\.0\.\d+"`).Match(htmx) {
		t.Errorf("vendor/htmx.min.js is not htmx 2.0.x; check static/package.json")
	}
	for _, name := range []string{"xterm.js", "addon-fit.js"} {
		b, err := os.ReadFile(filepath.Join("vendor", name))
		if err != nil {
			t.Fatalf("read %s: %v", name, err)
		}
		if strings.Contains(string(b), "sourceMappingURL=") {
			t.Errorf("vendor/%s still points at a source map the handler cannot serve", name)
		}
	}
}
