package handlers

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"berth/db"
	"berth/environment"
	"berth/environment/jail/jailtest"
	"berth/environment/oci/ocitest"
	"berth/environment/plugincheck/plugintest"
	"berth/jobs"
	"berth/jobs/services"
	"berth/workspace"

	"berth/environment/datadir"
)

// pluginServiceWorkspace makes a ready shared execution workspace whose plan runs on environment
// envID, over a fresh directory holding files, from a project workspace that defines defs.
func (pr *pluginRuns) pluginServiceWorkspace(envID string, files map[string]string, defs ...db.ServiceDefinition) db.ExecutionWorkspace {
	pr.t.Helper()
	ctx := context.Background()
	src := jailtest.Dir(pr.t)
	for n, body := range files {
		if err := os.WriteFile(filepath.Join(src, n), []byte(body), 0o644); err != nil {
			pr.t.Fatal(err)
		}
	}
	pw, err := db.CreateProjectWorkspace(ctx, pr.pool, pr.r.A.ID, pr.project, db.ProjectWorkspaceFields{Name: "svc-" + filepath.Base(src),
		SourceType: "directory", Source: src, Services: defs})
	if err != nil {
		pr.t.Fatal(err)
	}
	res, err := pr.srv.workspaces.RealizeShared(ctx, src)
	if err != nil {
		pr.t.Fatal(err)
	}
	plan, _ := json.Marshal(workspace.Plan{EnvironmentID: envID, ServicesAllowed: true})
	ws, err := db.CreateExecutionWorkspace(ctx, pr.pool, db.NewExecutionWorkspace{CompanyID: pr.r.A.ID, ProjectID: pr.project,
		ProjectWorkspaceID: pw.ID, Mode: "shared", Strategy: "shared", Trust: "standard", Ref: res.Ref, Plan: plan})
	if err != nil {
		pr.t.Fatal(err)
	}
	if ws, err = db.MarkExecutionWorkspaceReady(ctx, pr.pool, ws.ID, ws.Generation, db.Realized{}); err != nil {
		pr.t.Fatal(err)
	}
	return ws
}

// podmanEnv is a podman environment (bridge network, one service port) whose active image
// version is the node image, imported from a registry on loopback; it returns its id and the
// podman socket.
func (pr *pluginRuns) podmanEnv(settings map[string]any) (string, string) {
	pr.t.Helper()
	sum := plugintest.Build(pr.t, "./cmd/berth-driver-podman", pr.dir, "berth-driver-podman")
	sock := plugintest.Podman(pr.t, pr.runAs)
	addr := ocitest.StartRegistry(pr.t)
	ref, err := name.ParseReference(addr + "/berth/node:20")
	if err != nil {
		pr.t.Fatal(err)
	}
	if err := remote.Write(ref, ocitest.NodeImage(pr.t)); err != nil {
		pr.t.Fatalf("push: %v", err)
	}
	settings["socket"] = sock
	envID := pr.usePlugin("berth-driver-podman", sum, settings)
	if _, err := jobs.ImportImage(context.Background(), jobs.Deps{Pool: pr.pool, Data: datadir.At(pr.dataDir)}, jobs.ImportImageRequest{
		CompanyID: pr.r.A.ID, EnvironmentID: envID, Source: ref.String(), Activate: true}); err != nil {
		pr.t.Fatal(err)
	}
	return envID, sock
}

// podmanHas reports whether container name exists on the podman service at sock.
func podmanHas(t *testing.T, sock, container string) bool {
	t.Helper()
	err := exec.Command("podman", "--remote", "--url", "unix://"+sock, "container", "exists", container).Run()
	var ee *exec.ExitError
	if err != nil && !(errors.As(err, &ee) && ee.ExitCode() == 1) {
		t.Fatalf("podman container exists: %v", err)
	}
	return err == nil
}

const nodeServer = `node -e 'const fs=require("fs");require("http").createServer((q,s)=>s.end(fs.readFileSync("index.html","utf8")+" on "+process.env.BERTH_SERVICE_ID)).listen(+process.env.PORT)'`

// TestRuntimeServiceOnPodman: a runtime service of a workspace on a podman environment (from an
// imported OCI image) runs in a container of its own: the plugin's StartService publishes it on
// this host's loopback, Berth records that port, finds it healthy there, and both
// Deps.DialService (what the preview proxy dials) and the preview route reach its page. Stop is
// the plugin's StopService plus Release: the container is removed and the port is free; nothing
// of the service ever ran on this host.
func TestRuntimeServiceOnPodman(t *testing.T) {
	t.Parallel()
	pr := setupPluginRuns(t)
	envID, sock := pr.podmanEnv(map[string]any{"network": "bridge", "service_ports": []int{8000}})
	ws := pr.pluginServiceWorkspace(envID, map[string]string{"index.html": "hello from the container"},
		db.ServiceDefinition{Name: "web", Command: nodeServer, PortEnv: "PORT", HealthPath: "/", ReadyTimeoutS: 60, StopPolicy: "manual", Lifecycle: "ephemeral"})
	if code, out := pr.call(pr.r.Board, http.MethodPost, "/api/execution-workspaces/"+ws.ID+"/runtime-services/start",
		map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("start = %d %v", code, out)
	}
	sv := pr.waitService(ws.ID, "web", "running and healthy", func(sv map[string]any) bool {
		return sv["status"] == "running" && sv["health"] == "healthy" || sv["status"] == "failed"
	})
	if sv["status"] != "running" {
		t.Fatalf("service on podman = %v", sv)
	}
	id := sv["id"].(string)
	port := int(sv["port"].(float64))
	row, err := db.RuntimeServiceForProxy(context.Background(), pr.pool, id)
	if err != nil {
		t.Fatal(err)
	}
	container, ok := strings.CutPrefix(row.ProviderRef, "plugin:")
	if !ok || !podmanHas(t, sock, container) {
		t.Fatalf("provider ref %q names no container of the plugin", row.ProviderRef)
	}
	// Its processes carry the service's tag (as every service's do) and all live in the
	// container's pid namespace, none in this host's.
	tagged, err := environment.TaggedServices(context.Background())
	if err != nil || len(tagged[id]) == 0 {
		t.Fatalf("no process tagged with the service: %v %v", tagged, err)
	}
	hostNS, _ := os.Readlink("/proc/self/ns/pid")
	for _, pid := range tagged[id] {
		if ns, _ := os.Readlink(filepath.Join("/proc", strconv.Itoa(pid), "ns", "pid")); ns == hostNS {
			t.Fatalf("pid %d of the service runs in this host's pid namespace", pid)
		}
	}

	// What the preview proxy dials: the recorded loopback port, not a namespace.
	c, err := pr.jobs.Services.DialService(context.Background(), ws.ID, port)
	if err != nil {
		t.Fatalf("dial service: %v", err)
	}
	_, _ = io.WriteString(c, "GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
	resp, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	c.Close()
	if want := "hello from the container on " + id; resp.StatusCode != 200 || string(body) != want {
		t.Fatalf("dialled service = %d %q, want %q", resp.StatusCode, body, want)
	}
	// And the service's preview origin, as a member of the company.
	if code, pbody := getWith(t, sv["url"].(string), pr.r.Viewer.Token); code != 200 || !strings.Contains(pbody, "hello from the container") {
		t.Fatalf("preview %s = %d %q", sv["url"], code, pbody)
	}

	if code, out := pr.call(pr.r.Board, http.MethodPost, "/api/execution-workspaces/"+ws.ID+"/runtime-services/stop",
		map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("stop = %d %v", code, out)
	}
	sv = pr.waitService(ws.ID, "web", "stopped", serviceIs("stopped", ""))
	if sv["stop_reason"] != "requested" {
		t.Fatalf("stopped service = %v", sv)
	}
	if podmanHas(t, sock, container) {
		t.Fatal("the service's container outlived its stop")
	}
	deadline := time.Now().Add(30 * time.Second)
	for !environment.PortFree(port) {
		if time.Now().After(deadline) {
			t.Fatalf("port %d still taken after the stop", port)
		}
		time.Sleep(50 * time.Millisecond)
	}
	if _, err := pr.jobs.Services.DialService(context.Background(), ws.ID, port); err == nil {
		t.Fatal("the stopped service still answers")
	}
}

// TestRuntimeServiceOnPluginWithoutServices: a plugin whose Info names no services capability
// (the contract-keeping test plugin) gets no runtime service: the start is refused on the row
// (failed, stop_reason services_unsupported, the reason in its log excerpt), the preview has
// nothing to reach, and nothing was started on this host instead. Control: the same workspace's
// definition on a local environment starts (TestRuntimeServicesAPI covers that path).
func TestRuntimeServiceOnPluginWithoutServices(t *testing.T) {
	t.Parallel()
	pr := setupPluginRuns(t)
	sum := plugintest.Build(t, "./environment/plugincheck/testplugin", pr.dir, "keeper")
	envID := pr.usePlugin("keeper", sum, map[string]any{})
	ws := pr.pluginServiceWorkspace(envID, map[string]string{"index.html": "x"},
		db.ServiceDefinition{Name: "web", Command: "exec python3 -m http.server $PORT", PortEnv: "PORT", HealthPath: "/", StopPolicy: "manual", Lifecycle: "ephemeral"})
	if code, out := pr.call(pr.r.Board, http.MethodPost, "/api/execution-workspaces/"+ws.ID+"/runtime-services/start",
		map[string]any{"name": "web"}); code != http.StatusAccepted {
		t.Fatalf("start = %d %v", code, out)
	}
	sv := pr.waitService(ws.ID, "web", "refused", func(sv map[string]any) bool { return sv["status"] == "failed" || sv["status"] == "running" })
	if sv["status"] != "failed" || sv["stop_reason"] != services.StopServicesUnsupported ||
		!strings.Contains(sv["log_excerpt"].(string), "does not offer runtime services") {
		t.Fatalf("service on a plugin without services = %v", sv)
	}
	if sv["port"] != nil {
		t.Fatalf("a refused service holds port %v", sv["port"])
	}
	if tagged, _ := environment.TaggedServices(context.Background()); len(tagged[sv["id"].(string)]) != 0 {
		t.Fatalf("the refused service runs on this host: %v", tagged)
	}
	if code, body := getWith(t, sv["url"].(string), pr.r.Viewer.Token); code == 200 {
		t.Fatalf("preview of a refused service %s = %d %q", sv["url"], code, body)
	}
}
