package handlers

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"berth/environment/oci/ocitest"
)

// waitImageVersion waits for an environment's version number n and returns it.
func (re *runEnv) waitImageVersion(envID string, n int) map[string]any {
	re.t.Helper()
	deadline := time.Now().Add(90 * time.Second)
	for time.Now().Before(deadline) {
		_, out := re.call(re.r.Admin, http.MethodGet, "/api/environments/"+envID+"/image-versions", nil)
		items, _ := out["items"].([]any)
		for _, it := range items {
			v := it.(map[string]any)
			if int(v["number"].(float64)) == n {
				return v
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	re.t.Fatalf("image version %d of %s did not appear", n, envID)
	return nil
}

// TestImportImageFromRegistry: an instance admin imports an OCI image by reference, through the
// API (kept available) and through the environment page's form (activated); each version's digest
// is the image's manifest digest. Paths, other roles, other companies and environments without
// image versions are refused, with nothing queued.
func TestImportImageFromRegistry(t *testing.T) {
	t.Parallel()
	re := setupRuns(t)
	addr := ocitest.StartRegistry(t)
	img := ocitest.NodeImage(t)
	ref, _ := name.ParseReference(addr + "/berth/node:20")
	if err := remote.Write(ref, img); err != nil {
		t.Fatal(err)
	}
	digest, _ := img.Digest()
	env := re.envCreate(re.r.Admin, re.r.A.ID, map[string]any{"name": "sb", "driver": "sandbox"})
	envID := env["id"].(string)
	path := "/api/environments/" + envID + "/image-imports"

	jobsBefore := re.count(`SELECT count(*) FROM river_job WHERE kind = 'import_image'`)
	for _, tc := range []struct {
		who  actor
		body map[string]any
		want int
	}{
		{re.r.Admin, map[string]any{"source": "/etc/passwd"}, http.StatusUnprocessableEntity},
		{re.r.Admin, map[string]any{"source": "./image.tar"}, http.StatusUnprocessableEntity},
		{re.r.Admin, map[string]any{"source": "http://" + addr + "/berth/node:20"}, http.StatusUnprocessableEntity},
		{re.r.Admin, map[string]any{"source": ref.String(), "path": "/x"}, http.StatusBadRequest},
		{re.r.Board, map[string]any{"source": ref.String()}, http.StatusForbidden},
		{re.r.Other, map[string]any{"source": ref.String()}, http.StatusNotFound},
	} {
		if code, out := re.call(tc.who, http.MethodPost, path, tc.body); code != tc.want {
			t.Fatalf("%s %v = %d %v, want %d", tc.who.User.Email, tc.body, code, out, tc.want)
		}
	}
	local := re.envCreate(re.r.Admin, re.r.A.ID, map[string]any{"name": "loc", "driver": "local"})["id"].(string)
	if code, out := re.call(re.r.Admin, http.MethodPost, "/api/environments/"+local+"/image-imports",
		map[string]any{"source": ref.String()}); code != http.StatusConflict {
		t.Fatalf("import into a local environment = %d %v", code, out)
	}
	if n := re.count(`SELECT count(*) FROM river_job WHERE kind = 'import_image'`); n != jobsBefore {
		t.Fatalf("refused imports queued %d jobs", n-jobsBefore)
	}

	// The API: kept available next to the active empty layer (version 1).
	if code, out := re.call(re.r.Admin, http.MethodPost, path, map[string]any{"source": ref.String()}); code != http.StatusAccepted {
		t.Fatalf("import = %d %v", code, out)
	}
	v := re.waitImageVersion(envID, 2)
	if v["digest"] != digest.String() || v["status"] != "available" {
		t.Fatalf("version 2 = %v, want available with digest %s", v, digest)
	}
	// The page's form, activating.
	browser := re.browser(re.r.Admin)
	if code, page := re.envGet(browser, "/environments/"+envID); code != http.StatusOK || !strings.Contains(page, `id="import-image"`) {
		t.Fatalf("environment page = %d, import form shown = %v", code, strings.Contains(page, `id="import-image"`))
	}
	if code, page := re.envGet(re.browser(re.r.Board), "/environments/"+envID); code != http.StatusOK || strings.Contains(page, `id="import-image"`) {
		t.Fatalf("a board member's page shows the import form")
	}
	resp, body := re.envForm(browser, "/environments/"+envID+"/image-imports", url.Values{"source": {ref.String()}, "activate": {"on"}}, false)
	if resp.StatusCode != http.StatusSeeOther && resp.StatusCode != http.StatusOK {
		t.Fatalf("import form = %d %s", resp.StatusCode, body)
	}
	v = re.waitImageVersion(envID, 3)
	if v["digest"] != digest.String() || v["status"] != "active" {
		t.Fatalf("version 3 = %v, want active", v)
	}
	var source string
	if err := re.pool.QueryRow(context.Background(), `SELECT source FROM image_versions WHERE environment_id = $1 AND number = 3`, envID).
		Scan(&source); err != nil || source != "registry "+ref.Name() {
		t.Fatalf("source = %q %v", source, err)
	}
	if n := re.count(`SELECT count(*) FROM audit_events WHERE action = 'image_version.imported' AND target_id = $1`, envID); n != 2 {
		t.Fatalf("%d image_version.imported audit events, want 2", n)
	}
}

// TestPluginEnvironmentForm: the creation form makes a plugin environment (file name, pin,
// settings); bad settings are a field error and nothing is created; the page shows the pin.
func TestPluginEnvironmentForm(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	c := e.browser(r.Admin)
	list := "/companies/" + r.A.ID + "/environments"
	sum := strings.Repeat("0a", 32)
	before := e.count(`SELECT count(*) FROM environments`)
	_, body := e.envForm(c, list, url.Values{"name": {"pod"}, "driver": {"plugin"}, "plugin": {"berth-driver-podman"},
		"sha256": {sum}, "settings": {"{not json"}}, false)
	if !strings.Contains(body, "must be a JSON object") || e.count(`SELECT count(*) FROM environments`) != before {
		t.Fatalf("bad settings were not a field error, or something was created")
	}
	resp, _ := e.envForm(c, list, url.Values{"name": {"pod"}, "driver": {"plugin"}, "plugin": {"berth-driver-podman"},
		"sha256": {sum}, "settings": {`{"socket": "/run/podman/podman.sock"}`}}, false)
	if resp.StatusCode >= 400 {
		t.Fatalf("create = %d", resp.StatusCode)
	}
	var id, cfg string
	if err := e.pool.QueryRow(context.Background(), `SELECT id, config::text FROM environments WHERE name = 'pod'`).Scan(&id, &cfg); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(cfg, sum) || !strings.Contains(cfg, "/run/podman/podman.sock") {
		t.Fatalf("stored config = %s", cfg)
	}
	if code, page := e.envGet(c, "/environments/"+id); code != 200 || !strings.Contains(page, sum) || !strings.Contains(page, "SHA-256 pin") {
		t.Fatalf("the environment page = %d, pin shown = %v", code, strings.Contains(page, sum))
	}
}
