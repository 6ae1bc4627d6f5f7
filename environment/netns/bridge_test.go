package netns

import (
	"bufio"
	"io"
	"net/http"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"
)

// TestAPIBridgeMCP: the jail's API bridge passes /mcp (POST with its bearer token, without
// cookies; GET as a stream that reaches the jail event by event, before the response ends) and
// /api/, and nothing else of Berth.
func TestAPIBridgeMCP(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch {
		case r.Method == http.MethodGet && r.URL.Path == "/mcp":
			w.Header().Set("Content-Type", "text/event-stream")
			io.WriteString(w, "data: one\n\n")
			http.NewResponseController(w).Flush()
			select {
			case <-release:
			case <-r.Context().Done():
				return
			}
			io.WriteString(w, "data: two\n\n")
		default:
			io.WriteString(w, r.Method+" "+r.URL.Path+" auth="+r.Header.Get("Authorization")+" cookie="+r.Header.Get("Cookie"))
		}
	}))
	defer target.Close()
	u, _ := url.Parse(target.URL)
	bridge := httptest.NewServer(APIBridge(u))
	defer bridge.Close()

	req, _ := http.NewRequest(http.MethodPost, bridge.URL+"/mcp", strings.NewReader("{}"))
	req.Header.Set("Authorization", "Bearer berth_run")
	req.Header.Set("Cookie", "berth_session=stolen")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if string(body) != "POST /mcp auth=Bearer berth_run cookie=" {
		t.Fatalf("POST /mcp through the bridge = %d %q", resp.StatusCode, body)
	}

	resp, err = http.Get(bridge.URL + "/mcp")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	lines := make(chan string, 4)
	go func() {
		sc := bufio.NewScanner(resp.Body)
		for sc.Scan() {
			if sc.Text() != "" {
				lines <- sc.Text()
			}
		}
		close(lines)
	}()
	select {
	case l := <-lines:
		if l != "data: one" {
			t.Fatalf("first stream line = %q", l)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the GET stream's first event did not pass the bridge before the response ended")
	}
	close(release)
	if l := <-lines; l != "data: two" {
		t.Fatalf("second stream line = %q", l)
	}

	for _, p := range []string{"/api/tasks/x", "/events", "/preview/x/", "/mcpx", "/login", "/metrics"} {
		resp, err := http.Get(bridge.URL + p)
		if err != nil {
			t.Fatal(err)
		}
		resp.Body.Close()
		if want := strings.HasPrefix(p, "/api/"); (resp.StatusCode == http.StatusOK) != want {
			t.Fatalf("GET %s through the bridge = %d", p, resp.StatusCode)
		}
	}
}
