package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"berth/db"
	"berth/environment"
	"berth/environment/oci/ocitest"
	"berth/environment/plugincheck/plugintest"
	"berth/jobs"

	"berth/environment/datadir"
)

// pluginRuns is a run world whose workers host plugins from their own plugin dir.
type pluginRuns struct {
	*runEnv
	dir, state string
	runAs      *environment.PluginIdentity
	host       *environment.PluginHost
	jobs       *jobs.Deps // the workers' deps (Services: what the preview origin dials through)
}

func setupPluginRuns(t *testing.T) *pluginRuns {
	t.Helper()
	runAs, err := environment.PluginRunAs(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	pr := &pluginRuns{dir: plugintest.Dir(t), state: plugintest.Dir(t), runAs: runAs}
	host := environment.NewPluginHost(environment.PluginHostOptions{Dir: pr.dir, StateDir: pr.state, RunAs: runAs})
	pr.host = host
	t.Cleanup(func() { host.Close() })
	pr.runEnv = setupRunsWorkers(t, func(d *jobs.Deps) { d.Plugins, pr.jobs = host, d })
	return pr
}

// usePlugin creates a plugin environment through the API (as an instance admin) and makes it
// the project's environment.
func (pr *pluginRuns) usePlugin(plugin, sum string, settings any) string {
	pr.t.Helper()
	code, env := pr.call(pr.r.Admin, http.MethodPost, "/api/companies/"+pr.r.A.ID+"/environments", map[string]any{
		"name": plugin, "driver": "plugin", "config": map[string]any{"plugin": plugin, "sha256": sum, "settings": settings}})
	if code != http.StatusCreated {
		pr.t.Fatalf("create plugin environment = %d %v", code, env)
	}
	id := env["id"].(string)
	if _, err := pr.pool.Exec(context.Background(), `UPDATE projects SET execution_policy = jsonb_set(execution_policy, '{environment_id}', to_jsonb($1::text))
		WHERE id = $2`, id, pr.project); err != nil {
		pr.t.Fatal(err)
	}
	return id
}

// TestRunOnPlugin: a plugin environment end to end with the test plugin keeping the contract: a
// run is blocked until a probe (which runs the pinned plugin) passes, then the workspace goes to
// the plugin as a capsule, the command runs there, the verified capsule comes back and is
// committed on the task branch, the receipt names the environment, and cleanup releases the
// plugin's instance. Neither jobs nor handlers know it is a plugin.
func TestRunOnPlugin(t *testing.T) {
	t.Parallel()
	pr := setupPluginRuns(t)
	sum := plugintest.Build(t, "./environment/plugincheck/testplugin", pr.dir, "keeper")
	pr.workspaceWith("echo setup-ran > setup.txt")
	envID := pr.usePlugin("keeper", sum, map[string]any{})
	task := pr.task(`test -f setup.txt && echo "from the plugin" > plugin.txt && rm README.md && echo done`)
	if code, out := pr.call(pr.r.Board, http.MethodPost, "/api/tasks/"+task.ID+"/runs", nil); code != http.StatusConflict {
		t.Fatalf("a run on an unprobed plugin environment = %d %v, want 409", code, out)
	}
	q := pr.probe(envID)
	checks, _ := json.Marshal(q["checks"])
	if q["ok"] != true || !strings.Contains(string(checks), "testplugin 1.0.0") {
		t.Fatalf("qualification = %v", q)
	}
	id := pr.start(task.ID, nil)
	run := pr.waitRun(id, "the end", ended)
	if run["status"] != "succeeded" || !strings.Contains(pr.log(id), "done") {
		t.Fatalf("run = %v log %q", run, pr.log(id))
	}
	if fin, _ := pr.settled(run); fin != "settled" {
		t.Fatalf("finalize = %q", fin)
	}
	if got := gitOut(t, pr.repo, "show", "berth/PRJ-1:plugin.txt"); got != "from the plugin" {
		t.Fatalf("plugin.txt on the task branch = %q", got)
	}
	if files := gitOut(t, pr.repo, "ls-tree", "--name-only", "berth/PRJ-1"); strings.Contains(files, "README.md") {
		t.Fatalf("a file deleted on the plugin's instance is still on the branch: %q", files)
	}
	code, rc := pr.call(pr.r.Board, http.MethodGet, "/api/runs/"+id+"/receipt", nil)
	if code != http.StatusOK || rc["environment_fingerprint"] == nil {
		t.Fatalf("receipt = %d %v", code, rc)
	}
	pr.waitCleanup(id)
	if left, _ := filepath.Glob(filepath.Join(pr.state, "keeper", "instances", "i-*")); len(left) != 0 {
		t.Fatalf("the plugin's instance outlived the lease's cleanup: %v", left)
	}
}

// waitCleanup waits until the run's lease is released and its cleanup succeeded.
func (pr *pluginRuns) waitCleanup(runID string) {
	pr.t.Helper()
	deadline := time.Now().Add(60 * time.Second)
	var status, cleanup string
	for time.Now().Before(deadline) {
		_ = pr.pool.QueryRow(context.Background(), `SELECT status, cleanup_status FROM environment_leases WHERE run_id = $1`, runID).
			Scan(&status, &cleanup)
		if status != db.LeaseActive && cleanup == db.LeaseCleanupSucceeded {
			return
		}
		time.Sleep(100 * time.Millisecond)
	}
	pr.t.Fatalf("lease of run %s: status %q cleanup %q, want released and cleaned up", runID, status, cleanup)
}

// TestRunOnCrashingPlugin: a plugin that dies in the middle of the command fails the run with
// driver_unavailable; the lease is settled like a dead node's work: released, and cleaned up by
// the restarted plugin (it started twice).
func TestRunOnCrashingPlugin(t *testing.T) {
	t.Parallel()
	pr := setupPluginRuns(t)
	sum := plugintest.Build(t, "./environment/plugincheck/testplugin", pr.dir, "tp-crash")
	pr.workspaceWith("")
	envID := pr.usePlugin("tp-crash", sum, map[string]any{})
	if q := pr.probe(envID); q["ok"] != true {
		t.Fatalf("qualification = %v", q)
	}
	task := pr.task("echo started; while :; do :; done")
	id := pr.start(task.ID, nil)
	run := pr.waitRun(id, "the end", ended)
	if run["status"] != "failed" || run["error_code"] != "driver_unavailable" {
		t.Fatalf("run on a crashing plugin = %v", run)
	}
	pr.waitCleanup(id)
	starts, _ := filepath.Glob(filepath.Join(pr.state, "tp-crash", "started-*"))
	if len(starts) < 2 {
		t.Fatalf("the plugin started %d times; the cleanup must have restarted it", len(starts))
	}
}

// TestRunOnPodmanFromImportedImage: the reference plugin end to end. A small realistic image
// (this host's sh, core tools and node, two layers with a whiteout) is pushed to a registry on
// loopback, imported by reference as the environment's active version, and a task runs node in
// a podman container from it: log live, work on the task branch, receipt with the image's
// manifest digest, lease cleaned up (the container removed).
func TestRunOnPodmanFromImportedImage(t *testing.T) {
	t.Parallel()
	pr := setupPluginRuns(t)
	sum := plugintest.Build(t, "./cmd/berth-driver-podman", pr.dir, "berth-driver-podman")
	sock := plugintest.Podman(t, pr.runAs)
	addr := ocitest.StartRegistry(t)
	img := ocitest.NodeImage(t)
	ref, err := name.ParseReference(addr + "/berth/node:20")
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Write(ref, img); err != nil {
		t.Fatalf("push: %v", err)
	}
	digest, _ := img.Digest()
	pr.workspaceWith("")
	envID := pr.usePlugin("berth-driver-podman", sum, map[string]any{"socket": sock})
	imported, err := jobs.ImportImage(context.Background(), jobs.Deps{Pool: pr.pool, Data: datadir.At(pr.dataDir)}, jobs.ImportImageRequest{
		CompanyID: pr.r.A.ID, EnvironmentID: envID, Source: ref.String(), Activate: true})
	if err != nil {
		t.Fatal(err)
	}
	if imported.Version.Digest != digest.String() || imported.Version.Status != db.ImageActive {
		t.Fatalf("imported version = %+v, want active with the manifest digest %s", imported.Version, digest)
	}
	if q := pr.probe(envID); q["ok"] != true {
		t.Fatalf("qualification = %v", q)
	}
	task := pr.task(`node -e 'require("fs").writeFileSync("node.txt", "node " + process.version + "\n"); console.log("hello from node")' && cat /etc/os-release && test ! -e /etc/obsolete`)
	id := pr.start(task.ID, nil)
	run := pr.waitRun(id, "the end", ended)
	log := pr.log(id)
	if run["status"] != "succeeded" || !strings.Contains(log, "hello from node") || !strings.Contains(log, "ID=berth-test") {
		t.Fatalf("run = %v log %q", run, log)
	}
	if fin, _ := pr.settled(run); fin != "settled" {
		t.Fatalf("finalize = %q", fin)
	}
	if got := gitOut(t, pr.repo, "show", "berth/PRJ-1:node.txt"); !strings.HasPrefix(got, "node v") {
		t.Fatalf("node.txt on the task branch = %q", got)
	}
	code, rc := pr.call(pr.r.Board, http.MethodGet, "/api/runs/"+id+"/receipt", nil)
	if code != http.StatusOK || rc["image_digest"] != digest.String() {
		t.Fatalf("receipt = %d %v, want image_digest %s", code, rc, digest)
	}
	pr.waitCleanup(id)
}
