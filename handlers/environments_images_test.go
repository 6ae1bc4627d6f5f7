package handlers

import (
	"context"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"berth/db"
	"berth/workspace"
)

func TestEnvironmentImageVersions(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	ctx := context.Background()
	box := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "box", "driver": "sandbox"})["id"].(string)
	local := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "here", "driver": "local"})["id"].(string)
	versions := "/api/environments/" + box + "/image-versions"
	empty := workspace.Manifest{}.Digest()

	for _, tc := range []struct {
		who  string
		a    actor
		want int
	}{{"board", r.Board, 200}, {"viewer", r.Viewer, 200}, {"admin", r.Admin, 200}, {"other company", r.Other, 404}} {
		code, out := e.call(tc.a, http.MethodGet, versions, nil)
		if code != tc.want {
			t.Errorf("%s: GET image versions = %d %v, want %d", tc.who, code, out, tc.want)
			continue
		}
		if code != 200 {
			continue
		}
		items, _ := out["items"].([]any)
		if len(items) != 1 || out["next_cursor"] != "" {
			t.Fatalf("%s: image versions = %v, want version 1 only", tc.who, out)
		}
		v := items[0].(map[string]any)
		if v["number"] != 1.0 || v["status"] != "active" || v["digest"] != empty || v["size"] != 0.0 || v["session_id"] != nil {
			t.Fatalf("version 1 = %v, want the active empty layer %s", v, empty)
		}
		if _, err := time.Parse(time.RFC3339, v["created_at"].(string)); err != nil {
			t.Fatalf("created_at = %v", v["created_at"])
		}
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE target_id = $1 AND action = 'environment.created'
		AND details->>'image_version' = '1'`, box); n != 1 {
		t.Errorf("sandbox creation audited with its image version %d times, want 1", n)
	}
	if code, out := e.call(r.Viewer, http.MethodGet, "/api/environments/"+local+"/image-versions", nil); code != 200 || len(out["items"].([]any)) != 0 {
		t.Fatalf("local environment's image versions = %d %v, want none", code, out)
	}
	if code, _ := e.call(r.Viewer, http.MethodGet, "/api/environments/not-a-uuid/image-versions", nil); code != 404 {
		t.Fatalf("malformed id = %d, want 404", code)
	}

	// Newest first, paged.
	for range 2 {
		if _, err := db.CreateImageVersion(ctx, e.pool, db.NewImageVersion{CompanyID: r.A.ID, EnvironmentID: box,
			Digest: "sha256:" + strings.Repeat("ab", 32), Size: 3 << 20, Status: db.ImageAvailable}); err != nil {
			t.Fatal(err)
		}
	}
	code, out := e.call(r.Viewer, http.MethodGet, versions+"?limit=2", nil)
	items, _ := out["items"].([]any)
	if code != 200 || len(items) != 2 || items[0].(map[string]any)["number"] != 3.0 || out["next_cursor"] == "" {
		t.Fatalf("first page = %d %v, want 3, 2 and a cursor", code, out)
	}
	code, out = e.call(r.Viewer, http.MethodGet, versions+"?limit=2&cursor="+url.QueryEscape(out["next_cursor"].(string)), nil)
	items, _ = out["items"].([]any)
	if code != 200 || len(items) != 1 || items[0].(map[string]any)["number"] != 1.0 || out["next_cursor"] != "" {
		t.Fatalf("second page = %d %v, want 1 and no cursor", code, out)
	}
	if code, out := e.call(r.Viewer, http.MethodGet, versions+"?cursor=not*a*cursor", nil); code != 400 || envErrorCode(out) != "bad_cursor" {
		t.Fatalf("bad cursor = %d %v", code, out)
	}
	if code, out := e.call(r.Viewer, http.MethodGet, versions+"?limit=0", nil); code != 400 || envErrorCode(out) != "bad_limit" {
		t.Fatalf("bad limit = %d %v", code, out)
	}

	// The page lists them for a sandbox, and says which one is active.
	_, body := e.envGet(e.browser(r.Viewer), "/environments/"+box)
	if !strings.Contains(body, `id="environment-images"`) || !strings.Contains(body, shortDigest(empty)) ||
		!strings.Contains(body, "version 1 ("+shortDigest(empty)+")") || !strings.Contains(body, "3.0 MiB") {
		t.Fatal("the sandbox page does not list its image versions and the active one")
	}
	if _, body := e.envGet(e.browser(r.Viewer), "/environments/"+local); strings.Contains(body, `id="environment-images"`) {
		t.Fatal("a local environment's page shows image versions")
	}

	// A local environment that becomes a sandbox gets version 1 in the same change.
	code, out = e.call(r.Admin, http.MethodPatch, "/api/environments/"+local, map[string]any{"driver": "sandbox", "config": map[string]any{}})
	if code != 200 {
		t.Fatalf("PATCH to sandbox = %d %v", code, out)
	}
	v, err := db.ActiveImageVersion(ctx, e.pool, r.A.ID, local)
	if err != nil || v.Number != 1 || v.Digest != empty {
		t.Fatalf("active version after becoming a sandbox = %+v %v", v, err)
	}
	// Switching back and forth keeps the versions and makes no second one.
	for _, driver := range []string{"local", "sandbox"} {
		if code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+local, map[string]any{"driver": driver, "config": map[string]any{}}); code != 200 {
			t.Fatalf("PATCH to %s = %d %v", driver, code, out)
		}
	}
	if n := e.count(`SELECT count(*) FROM image_versions WHERE environment_id = $1`, local); n != 1 {
		t.Fatalf("versions after switching drivers = %d, want 1", n)
	}
}
