package environment

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"berth/environment/netns"
)

// TestJailNetworkNamespace (DESIGN §15, issue 20): a jail of a workspace has the workspace's own
// network namespace. From inside, nothing on the host's loopback answers (a listener of the test,
// as Berth's own, PostgreSQL or another company's dev server would be); BERTH_API_URL still
// reaches Berth's API through the bridge on the namespace's loopback, and only the API; a service
// the workspace runs is reachable from the workspace's runs, from the preview side (DialService's
// way) and from nowhere else: not from another workspace's run, not from the host's loopback. The
// negative controls reach the same host listener from the host, and the same run reaches its
// own workspace's service.
func TestJailNetworkNamespace(t *testing.T) {
	if !netns.Available() {
		t.Skip("network namespaces need root")
	}
	t.Parallel()
	api := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		fmt.Fprintf(w, "berth api %s auth=%s cookie=%q", r.URL.Path, r.Header.Get("Authorization"), r.Header.Get("Cookie"))
	}))
	defer api.Close()
	target, _ := url.Parse(api.URL)
	nets, err := netns.NewNetworks(netns.Serve(target, nil))
	if err != nil {
		t.Fatal(err)
	}
	defer nets.Close()
	host, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer host.Close()
	go http.Serve(host, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "host secret") })) //nolint:errcheck
	hostPort := strconv.Itoa(host.Addr().(*net.TCPAddr).Port)

	root := workDir(t)
	wsA, wsB := filepath.Join(root, "data", "workspaces", "ws-a"), filepath.Join(root, "data", "workspaces", "ws-b")
	for _, d := range []string{wsA, wsB} {
		if err := os.MkdirAll(d, 0o755); err != nil {
			t.Fatal(err)
		}
	}
	if err := os.WriteFile(filepath.Join(wsA, "index.html"), []byte("service of A"), 0o644); err != nil {
		t.Fatal(err)
	}
	opts := Options{Jail: &testJail, DataDir: filepath.Join(root, "data"), Masks: []string{filepath.Join(root, "data")}, Networks: nets}
	d, err := newLocal(Config{Driver: DriverLocal}, opts)
	if err != nil {
		t.Fatal(err)
	}
	run := func(ws, key, command string) (int, string) {
		t.Helper()
		var log bytes.Buffer
		res, err := execWithin(t, t.Context(), d, ExecRequest{Command: command, Dir: ws, Tag: newTag(t), Log: &log, Network: key,
			Timeout: 30 * time.Second, Env: map[string]string{"BERTH_RUN_TOKEN": "tok", "BERTH_API_URL": api.URL}})
		if err != nil {
			t.Fatalf("exec %q: %v", command, err)
		}
		return res.ExitCode, log.String()
	}

	// A service of workspace A, in A's namespace.
	pl, err := ServicePlacement(Config{Driver: DriverLocal}, opts, "")
	if err != nil {
		t.Fatal(err)
	}
	var sup Supervisor
	port, err := ReservePort(0, func(int) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	id := "svc-" + newTag(t)
	if _, err := sup.Start(t.Context(), ServiceSpec{ID: id, WorkspaceID: "ws-a", Command: "exec python3 -m http.server $PORT --bind 127.0.0.1",
		Root: wsA, Port: port, HealthPath: "/", ReadyTimeout: 30 * time.Second, LogPath: filepath.Join(root, "svc.log"), Placement: pl}); err != nil {
		log, _ := os.ReadFile(filepath.Join(root, "svc.log"))
		t.Fatalf("start service: %v\n%s", err, log)
	}
	defer sup.Stop(context.Background(), id)
	svc := "http://127.0.0.1:" + strconv.Itoa(port) + "/index.html"

	for _, c := range []struct {
		name, ws, key, command string
		wantExit               int
		want                   string
	}{
		{"host loopback refused", wsA, "ws-a", "curl -sS --max-time 3 --noproxy '*' http://127.0.0.1:" + hostPort + "/", 7, ""},
		{"API through the bridge", wsA, "ws-a", `curl -sS --max-time 5 -H "Authorization: Bearer $BERTH_RUN_TOKEN" -H 'Cookie: stolen=1' "$BERTH_API_URL/api/me"`, 0,
			`berth api /api/me auth=Bearer tok cookie=""`},
		{"only the API", wsA, "ws-a", `curl -s -o /dev/null -w '%{http_code}' --max-time 5 "$BERTH_API_URL/login"`, 0, "404"},
		{"own service", wsA, "ws-a", "curl -sS --max-time 5 --noproxy '*' " + svc, 0, "service of A"},
		{"another workspace's service refused", wsB, "ws-b", "curl -sS --max-time 3 --noproxy '*' " + svc, 7, ""},
	} {
		t.Run(c.name, func(t *testing.T) {
			exit, log := run(c.ws, c.key, c.command)
			if exit != c.wantExit || (c.want != "" && !strings.Contains(log, c.want)) {
				t.Fatalf("exit %d, output %q; want exit %d with %q", exit, log, c.wantExit, c.want)
			}
		})
	}
	// The host reaches the service only through the namespace (DialService's way), never on
	// its own loopback; the host listener answers the host (negative control).
	if resp, err := http.Get(svc); err == nil {
		resp.Body.Close()
		t.Fatal("the service is on the host's loopback")
	}
	c, err := nets.Dial(t.Context(), "ws-a", "tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatalf("dial the service in its namespace: %v", err)
	}
	c.Close()
	if resp, err := http.Get("http://127.0.0.1:" + hostPort + "/"); err != nil {
		t.Fatalf("negative control: %v", err)
	} else {
		resp.Body.Close()
	}
}
