package handlers

import (
	"bytes"
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync"
	"testing"

	"golang.org/x/crypto/ssh"

	"berth/db"
	"berth/environment/seal"
)

// envKeys is a fresh ed25519 key pair: the private key as PEM, the public key as an
// authorized_keys line, and a piece of the PEM body to search responses for.
type envKeys struct {
	Private, Public, Marker string
}

func newEnvKeys(t *testing.T) envKeys {
	t.Helper()
	pub, priv, err := ed25519.GenerateKey(rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	block, err := ssh.MarshalPrivateKey(priv, "")
	if err != nil {
		t.Fatal(err)
	}
	sshPub, err := ssh.NewPublicKey(pub)
	if err != nil {
		t.Fatal(err)
	}
	p := string(pem.EncodeToMemory(block))
	lines := strings.Split(p, "\n")
	return envKeys{Private: p, Public: strings.TrimSpace(string(ssh.MarshalAuthorizedKey(sshPub))), Marker: lines[2]}
}

// envRaw sends a JSON API request and returns the status and the raw body.
func (e *testEnv) envRaw(a actor, method, path string, body any) (int, string) {
	e.t.Helper()
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			e.t.Fatal(err)
		}
		rd = bytes.NewReader(b)
	}
	h := map[string]string{"Authorization": "Bearer " + a.Token}
	if rd != nil {
		h["Content-Type"] = "application/json"
	}
	resp := e.do(http.DefaultClient, method, path, rd, h)
	return resp.StatusCode, readBody(e.t, resp)
}

// envCreate creates an environment through the API as a and returns it.
func (e *testEnv) envCreate(a actor, companyID string, body map[string]any) map[string]any {
	e.t.Helper()
	code, out := e.call(a, http.MethodPost, "/api/companies/"+companyID+"/environments", body)
	if code != http.StatusCreated {
		e.t.Fatalf("create environment = %d %v", code, out)
	}
	return out
}

// envForm posts a form from a browser, optionally as htmx.
func (e *testEnv) envForm(c *http.Client, path string, form url.Values, htmx bool) (*http.Response, string) {
	e.t.Helper()
	h := map[string]string{"Content-Type": "application/x-www-form-urlencoded"}
	if htmx {
		h["HX-Request"] = "true"
	}
	resp := e.do(c, http.MethodPost, path, strings.NewReader(form.Encode()), h)
	return resp, readBody(e.t, resp)
}

// envGet fetches a page from a browser.
func (e *testEnv) envGet(c *http.Client, path string) (int, string) {
	e.t.Helper()
	resp := e.do(c, http.MethodGet, path, nil, nil)
	return resp.StatusCode, readBody(e.t, resp)
}

// envRow is what a test compares to prove nothing changed.
func (e *testEnv) envRow(id string) string {
	e.t.Helper()
	var s string
	err := e.pool.QueryRow(context.Background(), `SELECT concat_ws('|', name, driver, status, config::text,
		encode(coalesce(secrets, ''), 'hex'), coalesce(qualification::text, 'null'), updated_at::text)
		FROM environments WHERE id = $1`, id).Scan(&s)
	if err != nil {
		e.t.Fatal(err)
	}
	return s
}

func envErrorCode(out map[string]any) string {
	errObj, _ := out["error"].(map[string]any)
	code, _ := errObj["code"].(string)
	return code
}

func envErrorFields(out map[string]any) map[string]any {
	errObj, _ := out["error"].(map[string]any)
	fields, _ := errObj["fields"].(map[string]any)
	return fields
}

// sshBody is a valid ssh environment with a secret variable.
func sshBody(name string, k envKeys) map[string]any {
	return map[string]any{"name": name, "driver": "ssh", "config": map[string]any{
		"host": "build-1.example.com", "user": "deploy", "private_key": k.Private, "host_key": k.Public,
		"env": []map[string]any{{"name": "API_TOKEN", "value": "tok-very-secret-123", "secret": true}, {"name": "MODE", "value": "ci"}},
	}}
}

func TestEnvironmentAPIRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	env := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})
	id := env["id"].(string)
	list := "/api/companies/" + r.A.ID + "/environments"
	one := "/api/environments/" + id

	for _, tc := range []struct {
		who  string
		a    actor
		want int
	}{{"board", r.Board, 200}, {"viewer", r.Viewer, 200}, {"admin", r.Admin, 200}, {"other company", r.Other, 404}} {
		if code, out := e.call(tc.a, http.MethodGet, list, nil); code != tc.want {
			t.Errorf("%s: GET list = %d %v, want %d", tc.who, code, out, tc.want)
		} else if code == 200 && len(out["items"].([]any)) != 1 {
			t.Errorf("%s: list = %v", tc.who, out)
		}
		if code, out := e.call(tc.a, http.MethodGet, one, nil); code != tc.want {
			t.Errorf("%s: GET one = %d %v, want %d", tc.who, code, out, tc.want)
		}
	}

	before, rows := e.envRow(id), e.count(`SELECT count(*) FROM environments`)
	for _, tc := range []struct {
		who  string
		a    actor
		want int
	}{{"board", r.Board, 403}, {"viewer", r.Viewer, 403}, {"other company", r.Other, 404}} {
		code, out := e.call(tc.a, http.MethodPost, list, map[string]any{"name": "x-" + tc.who, "driver": "local"})
		if code != tc.want {
			t.Errorf("%s: POST = %d %v, want %d", tc.who, code, out, tc.want)
		}
		code, out = e.call(tc.a, http.MethodPatch, one, map[string]any{"name": "renamed"})
		if code != tc.want {
			t.Errorf("%s: PATCH = %d %v, want %d", tc.who, code, out, tc.want)
		}
		code, out = e.call(tc.a, http.MethodPatch, one, map[string]any{"status": "archived"})
		if code != tc.want {
			t.Errorf("%s: PATCH archive = %d %v, want %d", tc.who, code, out, tc.want)
		}
	}
	if e.envRow(id) != before || e.count(`SELECT count(*) FROM environments`) != rows {
		t.Fatal("a refused write changed something")
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action IN
		('environment.create.denied', 'environment.update.denied')`, r.A.ID); n != 6 {
		t.Errorf("denials audited = %d, want 6 (board and viewer, three writes each)", n)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE actor_id = $1`, r.Other.User.ID); n != 0 {
		t.Errorf("another company's probes were audited in a company: %d", n)
	}

	// The instance admin is not a member of A and still manages its environments.
	if code, out := e.call(r.Admin, http.MethodPost, list, map[string]any{"name": "second", "driver": "sandbox"}); code != 201 {
		t.Fatalf("admin POST = %d %v", code, out)
	}
	if code, out := e.call(r.Admin, http.MethodPatch, one, map[string]any{"name": "renamed"}); code != 200 || out["name"] != "renamed" {
		t.Fatalf("admin PATCH = %d %v", code, out)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE company_id = $1 AND action IN ('environment.created', 'environment.updated')`, r.A.ID); n != 3 {
		t.Errorf("changes audited = %d, want 3", n)
	}
	// Another company's environment is a 404 even to a board member of that other company.
	if code, _ := e.call(r.Other, http.MethodGet, "/api/environments/not-a-uuid", nil); code != 404 {
		t.Errorf("malformed id = %d, want 404", code)
	}
}

func TestEnvironmentPagesRoleMatrix(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})["id"].(string)
	listPage := "/companies/" + r.A.ID + "/environments"
	detail := "/environments/" + id
	browsers := map[string]*http.Client{"board": e.browser(r.Board), "viewer": e.browser(r.Viewer),
		"admin": e.browser(r.Admin), "other": e.browser(r.Other)}

	for who, c := range browsers {
		want := 200
		if who == "other" {
			want = 404
		}
		code, body := e.envGet(c, listPage)
		if code != want {
			t.Errorf("%s: list page = %d, want %d", who, code, want)
		}
		if hasForm := strings.Contains(body, `id="new-environment"`); code == 200 && hasForm != (who == "admin") {
			t.Errorf("%s: creation form shown = %v", who, hasForm)
		}
		code, body = e.envGet(c, detail)
		if code != want {
			t.Errorf("%s: detail page = %d, want %d", who, code, want)
		}
		if hasForm := strings.Contains(body, `id="edit-environment"`); code == 200 && hasForm != (who == "admin") {
			t.Errorf("%s: edit form shown = %v", who, hasForm)
		}
	}

	before, rows := e.envRow(id), e.count(`SELECT count(*) FROM environments`)
	for _, who := range []string{"board", "viewer", "other"} {
		want := 403
		if who == "other" {
			want = 404
		}
		c := browsers[who]
		if resp, _ := e.envForm(c, listPage, url.Values{"name": {"x"}, "driver": {"local"}}, false); resp.StatusCode != want {
			t.Errorf("%s: create form = %d, want %d", who, resp.StatusCode, want)
		}
		if resp, _ := e.envForm(c, detail, url.Values{"name": {"renamed"}, "driver": {"local"}}, false); resp.StatusCode != want {
			t.Errorf("%s: edit form = %d, want %d", who, resp.StatusCode, want)
		}
		for _, action := range []string{"/archive", "/unarchive"} {
			if resp, _ := e.envForm(c, detail+action, nil, false); resp.StatusCode != want {
				t.Errorf("%s: %s = %d, want %d", who, action, resp.StatusCode, want)
			}
		}
	}
	if e.envRow(id) != before || e.count(`SELECT count(*) FROM environments`) != rows {
		t.Fatal("a refused form changed something")
	}

	admin := browsers["admin"]
	resp, _ := e.envForm(admin, listPage, url.Values{"name": {"made in browser"}, "driver": {"local"}}, false)
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/environments/") {
		t.Fatalf("admin create form = %d %s", resp.StatusCode, resp.Header.Get("Location"))
	}
	if resp, _ := e.envForm(admin, detail, url.Values{"name": {"renamed"}, "driver": {"local"}}, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin edit form = %d", resp.StatusCode)
	}
	if resp, _ := e.envForm(admin, detail+"/archive", nil, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin archive = %d", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM environments WHERE id = $1 AND status = 'archived' AND name = 'renamed'`, id); n != 1 {
		t.Fatal("admin forms did not apply")
	}
	if resp, _ := e.envForm(admin, detail+"/unarchive", nil, false); resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("admin unarchive = %d", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE target_id = $1 AND action IN ('environment.archived', 'environment.unarchived')`, id); n != 2 {
		t.Fatalf("archive and restore audited %d times, want 2", n)
	}
}

// envLogBuffer collects the server's log lines safely across goroutines.
type envLogBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *envLogBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *envLogBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

func TestEnvironmentSecretsNeverLeak(t *testing.T) {
	t.Parallel()
	logs := &envLogBuffer{}
	e := setup(t, func(d *Deps) {
		d.Log = slog.New(slog.NewTextHandler(logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	})
	r := e.roles()
	k := newEnvKeys(t)
	secrets := []string{k.Marker, "tok-very-secret-123", "form-secret-456"}
	var seen []string // every response body and page
	check := func(where, body string) {
		t.Helper()
		seen = append(seen, body)
		for _, s := range secrets {
			if strings.Contains(body, s) {
				t.Fatalf("%s: a secret appears: %q", where, s)
			}
		}
	}

	code, body := e.envRaw(r.Admin, http.MethodPost, "/api/companies/"+r.A.ID+"/environments", sshBody("remote", k))
	if code != 201 {
		t.Fatalf("create = %d %s", code, body)
	}
	check("POST response", body)
	var created environmentJSON
	if err := json.Unmarshal([]byte(body), &created); err != nil {
		t.Fatal(err)
	}
	if pk, _ := json.Marshal(created.Config["private_key"]); string(pk) != `{"set":true}` {
		t.Fatalf("private_key = %s, want {\"set\":true}", pk)
	}
	if !strings.Contains(body, `"name":"API_TOKEN","secret":true,"value":{"set":true}`) || !strings.Contains(body, `"value":"ci"`) {
		t.Fatalf("env not redacted as specified: %s", body)
	}
	id := created.ID

	// A refused request never echoes what it was sent either.
	bad := sshBody("remote-2", k)
	bad["config"].(map[string]any)["host"] = "ssh://nope"
	code, body = e.envRaw(r.Admin, http.MethodPost, "/api/companies/"+r.A.ID+"/environments", bad)
	if code != 422 {
		t.Fatalf("invalid create = %d", code)
	}
	check("422 response", body)

	for _, a := range []actor{r.Admin, r.Board, r.Viewer} {
		_, body = e.envRaw(a, http.MethodGet, "/api/environments/"+id, nil)
		check("GET", body)
		_, body = e.envRaw(a, http.MethodGet, "/api/companies/"+r.A.ID+"/environments", nil)
		check("list", body)
	}
	_, body = e.envRaw(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"name": "remote-renamed"})
	check("PATCH", body)

	// A form-made secret, then every page as every reader.
	admin := e.browser(r.Admin)
	resp, page := e.envForm(admin, "/environments/"+id, url.Values{"name": {"remote-renamed"}, "driver": {"ssh"},
		"host": {"build-1.example.com"}, "port": {"22"}, "user": {"deploy"}, "host_key": {k.Public},
		"secret_env": {"API_TOKEN\nFORM_SECRET=form-secret-456"}, "env": {"MODE=ci"}}, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit form = %d %s", resp.StatusCode, page)
	}
	// A refused form (bad port) shows the form again without the pasted key or secret values.
	resp, page = e.envForm(admin, "/environments/"+id, url.Values{"name": {"remote-renamed"}, "driver": {"ssh"},
		"host": {"build-1.example.com"}, "port": {"99999"}, "user": {"deploy"}, "host_key": {k.Public}, "private_key": {k.Private},
		"secret_env": {"FORM_SECRET=form-secret-456"}}, false)
	if resp.StatusCode != http.StatusUnprocessableEntity {
		t.Fatalf("refused edit form = %d", resp.StatusCode)
	}
	check("refused form", page)
	for _, c := range []*http.Client{admin, e.browser(r.Board), e.browser(r.Viewer)} {
		_, page = e.envGet(c, "/environments/"+id)
		check("detail page", page)
		if !strings.Contains(page, ">set<") {
			t.Fatal("detail page does not show the secrets as set")
		}
		_, page = e.envGet(c, "/companies/"+r.A.ID+"/environments")
		check("list page", page)
	}

	var details string
	if err := e.pool.QueryRow(context.Background(), `SELECT coalesce(string_agg(details::text || action, ' '), '') FROM audit_events`).Scan(&details); err != nil {
		t.Fatal(err)
	}
	check("audit details", details)
	check("logs", logs.String())

	// At rest: no plaintext in the row; the sealed value opens only with this row's AAD.
	var cfgText string
	var sealed []byte
	if err := e.pool.QueryRow(context.Background(), `SELECT config::text, secrets FROM environments WHERE id = $1`, id).Scan(&cfgText, &sealed); err != nil {
		t.Fatal(err)
	}
	check("config column", cfgText)
	for _, s := range append(secrets, "PRIVATE KEY") {
		if bytes.Contains(sealed, []byte(s)) {
			t.Fatalf("secrets column holds plaintext %q", s)
		}
	}
	plain, err := e.srv.secrets.Open(sealed, "environment:"+id)
	if err != nil {
		t.Fatalf("sealed secrets do not open with their AAD: %v", err)
	}
	for _, s := range secrets {
		if !bytes.Contains(plain, []byte(s)) {
			t.Fatalf("sealed secrets lost %q", s)
		}
	}
	if _, err := e.srv.secrets.Open(sealed, "environment:"+r.B.ID); !errors.Is(err, seal.ErrUnseal) {
		t.Fatalf("sealed secrets opened with another row's AAD: %v", err)
	}
	if len(seen) == 0 {
		t.Fatal("nothing was checked")
	}
}

func TestEnvironmentServerOwnedFields(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})["id"].(string)
	before, rows := e.envRow(id), e.count(`SELECT count(*) FROM environments`)
	for _, field := range []string{"qualification", "company_id", "id", "generation", "created_at"} {
		for _, value := range []any{map[string]any{"ok": true}, nil, "x"} {
			body := map[string]any{"name": "new", "driver": "local", field: value}
			code, out := e.call(r.Admin, http.MethodPost, "/api/companies/"+r.A.ID+"/environments", body)
			if code != 400 || envErrorCode(out) != "server_owned_field" || out["error"].(map[string]any)["field"] != field {
				t.Errorf("POST with %s=%v = %d %v, want 400 server_owned_field naming it", field, value, code, out)
			}
			code, out = e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"name": "new", field: value})
			if code != 400 || envErrorCode(out) != "server_owned_field" || out["error"].(map[string]any)["field"] != field {
				t.Errorf("PATCH with %s=%v = %d %v, want 400 server_owned_field naming it", field, value, code, out)
			}
		}
	}
	if code, out := e.call(r.Admin, http.MethodPost, "/api/companies/"+r.A.ID+"/environments",
		map[string]any{"name": "new", "driver": "local", "status": "archived"}); code != 400 || envErrorCode(out) != "server_owned_field" {
		t.Errorf("POST with status = %d %v, want 400", code, out)
	}
	resp, _ := e.envForm(e.browser(r.Admin), "/environments/"+id, url.Values{"name": {"new"}, "driver": {"local"}, "qualification": {"ok"}}, false)
	if resp.StatusCode != 400 {
		t.Errorf("form with qualification = %d, want 400", resp.StatusCode)
	}
	if e.envRow(id) != before || e.count(`SELECT count(*) FROM environments`) != rows {
		t.Fatal("a refused request changed something")
	}
}

func TestEnvironmentQualificationClearing(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	k, k2 := newEnvKeys(t), newEnvKeys(t)
	sandbox := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "box", "driver": "sandbox"})["id"].(string)
	remote := e.envCreate(r.Admin, r.A.ID, sshBody("remote", k))["id"].(string)
	qualify := func(id string) {
		t.Helper()
		if _, err := e.pool.Exec(context.Background(), `UPDATE environments SET qualification =
			'{"ok": true, "probed_at": "2026-01-02T03:04:05Z", "summary": "probe passed", "config_fingerprint": "sha256:x", "image_digest": ""}'
			WHERE id = $1`, id); err != nil {
			t.Fatal(err)
		}
	}
	patch := func(id string, body map[string]any, wantCleared bool) {
		t.Helper()
		qualify(id)
		code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, body)
		if code != 200 {
			t.Fatalf("PATCH %v = %d %v", body, code, out)
		}
		stored := e.count(`SELECT count(*) FROM environments WHERE id = $1 AND qualification IS NULL`, id) == 1
		if cleared := out["qualification"] == nil; cleared != wantCleared || stored != wantCleared {
			t.Fatalf("PATCH %v: qualification cleared = %v (stored %v), want %v", body, cleared, stored, wantCleared)
		}
	}

	patch(sandbox, map[string]any{"name": "box-renamed"}, false)
	patch(sandbox, map[string]any{"config": map[string]any{"memory_mb": 1024, "cpus": 1.0, "network": false}}, false) // defaults spelled out
	patch(sandbox, map[string]any{"config": map[string]any{"memory_mb": 2048}}, true)
	patch(sandbox, map[string]any{"driver": "local", "config": map[string]any{}}, true)

	sshCfg := func(edit func(c map[string]any)) map[string]any {
		c := map[string]any{"host": "build-1.example.com", "user": "deploy", "host_key": k.Public,
			"private_key": map[string]bool{"set": true},
			"env":         []map[string]any{{"name": "API_TOKEN", "value": map[string]bool{"set": true}, "secret": true}, {"name": "MODE", "value": "ci"}}}
		if edit != nil {
			edit(c)
		}
		return map[string]any{"config": c}
	}
	patch(remote, sshCfg(nil), false) // everything kept
	patch(remote, sshCfg(func(c map[string]any) { c["private_key"] = k2.Private }), true)
	patch(remote, sshCfg(func(c map[string]any) {
		c["env"] = []map[string]any{{"name": "API_TOKEN", "value": "rotated", "secret": true}, {"name": "MODE", "value": "ci"}}
	}), true)
	patch(remote, sshCfg(func(c map[string]any) { c["host_key"] = k2.Public }), true)

	var changed string
	if err := e.pool.QueryRow(context.Background(), `SELECT details::text FROM audit_events
		WHERE target_id = $1 AND action = 'environment.updated' ORDER BY id DESC LIMIT 1`, remote).Scan(&changed); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(changed, `"config.host_key"`) || !strings.Contains(changed, `"qualification_cleared": true`) || strings.Contains(changed, k2.Public) {
		t.Fatalf("update audit details = %s", changed)
	}
}

func TestEnvironmentArchiveRefusedWhileLeased(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})["id"].(string)
	lease := func(status string) {
		t.Helper()
		if _, err := e.pool.Exec(context.Background(), `INSERT INTO environment_leases (company_id, environment_id, status)
			VALUES ($1, $2, $3)`, r.A.ID, id, status); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []string{"released", "expired", "failed", "active"} {
		lease(s)
	}
	before := e.envRow(id)
	code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"status": "archived"})
	if code != 409 || envErrorCode(out) != "lease_active" || out["error"].(map[string]any)["live_leases"] != 1.0 {
		t.Fatalf("archive with a live lease = %d %v, want 409 lease_active with live_leases 1", code, out)
	}
	if msg := out["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "1 lease holds") {
		t.Fatalf("message does not give the count and reason: %q", msg)
	}
	lease("acquiring")
	lease("releasing")
	_, out = e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"status": "archived", "name": "renamed"})
	if msg := out["error"].(map[string]any)["message"].(string); !strings.Contains(msg, "3 leases hold") {
		t.Fatalf("message = %q, want 3 leases", msg)
	}

	admin := e.browser(r.Admin)
	resp, page := e.envForm(admin, "/environments/"+id+"/archive", nil, false)
	if resp.StatusCode != 409 || !strings.Contains(page, "3 leases hold") {
		t.Fatalf("archive form = %d, want 409 with the reason", resp.StatusCode)
	}
	resp, page = e.envForm(admin, "/environments/"+id+"/archive", nil, true)
	if resp.StatusCode != 409 || !strings.Contains(page, `role="alert"`) || !strings.Contains(page, "3 leases hold") {
		t.Fatalf("htmx archive = %d, want 409 with the alert", resp.StatusCode)
	}
	if e.envRow(id) != before || e.count(`SELECT count(*) FROM audit_events WHERE action = 'environment.archived'`) != 0 {
		t.Fatal("a refused archive changed something")
	}

	if _, err := e.pool.Exec(context.Background(), `UPDATE environment_leases SET status = 'released' WHERE environment_id = $1`, id); err != nil {
		t.Fatal(err)
	}
	if code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"status": "archived"}); code != 200 || out["status"] != "archived" {
		t.Fatalf("archive = %d %v", code, out)
	}
	if code, out := e.call(r.Admin, http.MethodPatch, "/api/environments/"+id, map[string]any{"status": "active"}); code != 200 || out["status"] != "active" {
		t.Fatalf("unarchive = %d %v", code, out)
	}
	if n := e.count(`SELECT count(*) FROM audit_events WHERE target_id = $1 AND action IN ('environment.archived', 'environment.unarchived')`, id); n != 2 {
		t.Fatalf("archive and restore audited %d times, want 2", n)
	}
}

func TestEnvironmentHTMLEscaping(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	name := `<script>alert("env")</script>`
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": name, "driver": "local",
		"config": map[string]any{"env": []map[string]any{{"name": "X", "value": `"><img src=x onerror=alert(1)>`}}}})["id"].(string)
	for _, c := range []*http.Client{e.browser(r.Admin), e.browser(r.Board)} {
		for _, path := range []string{"/companies/" + r.A.ID + "/environments", "/environments/" + id} {
			code, page := e.envGet(c, path)
			if code != 200 {
				t.Fatalf("%s = %d", path, code)
			}
			if strings.Contains(page, `<script>alert`) || strings.Contains(page, `<img src=x`) {
				t.Fatalf("%s renders user text unescaped", path)
			}
			if !strings.Contains(page, `&lt;script&gt;alert(`) {
				t.Fatalf("%s does not show the escaped name", path)
			}
		}
	}
}

func TestEnvironmentAPIHygiene(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	list := "/api/companies/" + r.A.ID + "/environments"
	id := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "build", "driver": "local"})["id"].(string)
	one := "/api/environments/" + id
	before, rows := e.envRow(id), e.count(`SELECT count(*) FROM environments`)
	auth := map[string]string{"Authorization": "Bearer " + r.Admin.Token}

	for _, path := range []string{list, one} {
		method := http.MethodPost
		if path == one {
			method = http.MethodPatch
		}
		resp := e.do(http.DefaultClient, method, path, strings.NewReader(`name=x`), mergeHeaders(auth, map[string]string{"Content-Type": "text/plain"}))
		if resp.StatusCode != 415 {
			t.Errorf("%s %s text/plain = %d, want 415", method, path, resp.StatusCode)
		}
		huge := `{"name":"x","driver":"local","config":{"env":[{"name":"A","value":"` + strings.Repeat("a", 1<<20) + `"}]}}`
		resp = e.do(http.DefaultClient, method, path, strings.NewReader(huge), mergeHeaders(auth, map[string]string{"Content-Type": "application/json"}))
		if resp.StatusCode != 413 {
			t.Errorf("%s %s over 1 MiB = %d, want 413", method, path, resp.StatusCode)
		}
		for body, want := range map[string]int{
			`{"name":"x","driver":"local","colour":"red"}`: 400,
			`{"name":"x",`:            400,
			`["x"]`:                   400,
			`{"name":"x"} {"name":1}`: 400,
		} {
			if code, out := e.call(r.Admin, method, path, body); code != want {
				t.Errorf("%s %s %s = %d %v, want %d", method, path, body, code, out, want)
			}
		}
	}

	for _, tc := range []struct {
		method, path string
		body         map[string]any
		wantFields   []string
	}{
		{http.MethodPost, list, map[string]any{"name": "", "driver": "docker"}, []string{"name", "driver"}},
		{http.MethodPost, list, map[string]any{"name": "x", "driver": "ssh", "config": map[string]any{"port": 0}}, []string{"config.host", "config.user", "config.port", "config.private_key", "config.host_key"}},
		{http.MethodPost, list, map[string]any{"name": "x", "driver": "local", "config": map[string]any{"host": "h"}}, []string{"config.host"}},
		{http.MethodPost, list, map[string]any{"name": "x", "driver": "local", "config": "nope"}, []string{"config"}},
		{http.MethodPost, list, map[string]any{"name": nil, "driver": "local"}, []string{"name"}},
		{http.MethodPost, list, map[string]any{"name": 5, "driver": "local"}, []string{"name"}},
		{http.MethodPatch, one, map[string]any{"driver": 5}, []string{"driver"}},
		{http.MethodPatch, one, map[string]any{"driver": "sandbox"}, []string{"config"}},
		{http.MethodPatch, one, map[string]any{"status": "deleted"}, []string{"status"}},
		{http.MethodPatch, one, map[string]any{"config": nil}, []string{"config"}},
		{http.MethodPatch, one, map[string]any{"name": " "}, []string{"name"}},
		{http.MethodPatch, one, map[string]any{"config": map[string]any{"env": []map[string]any{{"name": "BERTH_TOKEN", "value": "x"}}}}, []string{"config.env[0].name"}},
		{http.MethodPatch, one, map[string]any{"config": map[string]any{"env": []map[string]any{{"name": "S", "secret": true, "value": map[string]bool{"set": true}}}}}, []string{"config.env[0].value"}},
	} {
		code, out := e.call(r.Admin, tc.method, tc.path, tc.body)
		if code != 422 || envErrorCode(out) != "validation_failed" {
			t.Errorf("%s %v = %d %v, want 422", tc.method, tc.body, code, out)
			continue
		}
		for _, f := range tc.wantFields {
			if _, ok := envErrorFields(out)[f]; !ok {
				t.Errorf("%s %v: fields %v lack %q", tc.method, tc.body, envErrorFields(out), f)
			}
		}
	}
	if e.envRow(id) != before || e.count(`SELECT count(*) FROM environments`) != rows {
		t.Fatal("a refused request changed something")
	}

	e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "taken", "driver": "local"})
	if code, out := e.call(r.Admin, http.MethodPost, list, map[string]any{"name": "taken", "driver": "sandbox"}); code != 409 || envErrorCode(out) != "name_taken" {
		t.Errorf("duplicate name = %d %v, want 409 name_taken", code, out)
	}
	if code, out := e.call(r.Admin, http.MethodPatch, one, map[string]any{"name": "taken"}); code != 409 || envErrorCode(out) != "name_taken" {
		t.Errorf("rename onto a taken name = %d %v, want 409 name_taken", code, out)
	}
	// The same name in another company is fine.
	if code, out := e.call(r.Admin, http.MethodPost, "/api/companies/"+r.B.ID+"/environments", map[string]any{"name": "taken", "driver": "local"}); code != 201 {
		t.Errorf("same name in company B = %d %v", code, out)
	}
	if e.envRow(id) != before {
		t.Fatal("a refused rename changed something")
	}
}

func TestEnvironmentListPagination(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	for i := 5; i >= 1; i-- {
		e.envCreate(r.Admin, r.A.ID, map[string]any{"name": fmt.Sprintf("env-%d", i), "driver": "local"})
	}
	e.envCreate(r.Admin, r.B.ID, map[string]any{"name": "env-b", "driver": "local"})
	var names []string
	cursor := ""
	for page := 0; page < 5; page++ {
		path := "/api/companies/" + r.A.ID + "/environments?limit=2"
		if cursor != "" {
			path += "&cursor=" + url.QueryEscape(cursor)
		}
		code, out := e.call(r.Viewer, http.MethodGet, path, nil)
		if code != 200 {
			t.Fatalf("page %d = %d %v", page, code, out)
		}
		items := out["items"].([]any)
		if len(items) > 2 {
			t.Fatalf("page %d has %d items", page, len(items))
		}
		for _, it := range items {
			names = append(names, it.(map[string]any)["name"].(string))
		}
		cursor, _ = out["next_cursor"].(string)
		if cursor == "" {
			break
		}
	}
	if strings.Join(names, ",") != "env-1,env-2,env-3,env-4,env-5" {
		t.Fatalf("paged names = %v", names)
	}
	for _, q := range []string{"limit=0", "limit=201", "limit=x", "cursor=!!!", "cursor=" + encodeCursor(db.EnvironmentCursor{Name: "a", ID: "nope"})} {
		if code, out := e.call(r.Viewer, http.MethodGet, "/api/companies/"+r.A.ID+"/environments?"+q, nil); code != 400 {
			t.Errorf("?%s = %d %v, want 400", q, code, out)
		}
	}
	code, page := e.envGet(e.browser(r.Viewer), "/companies/"+r.A.ID+"/environments?limit=2")
	if code != 200 || !strings.Contains(page, "Next page") || !strings.Contains(page, "limit=2") || strings.Contains(page, "env-3") || strings.Contains(page, "env-b") {
		t.Fatalf("list page with limit 2 = %d; next link / rows wrong", code)
	}
}

func TestEnvironmentForms(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	k := newEnvKeys(t)
	admin := e.browser(r.Admin)
	listPage := "/companies/" + r.A.ID + "/environments"

	code, page := e.envGet(admin, listPage)
	if code != 200 || !strings.Contains(page, "Add a local environment to run tasks on this machine") {
		t.Fatalf("admin empty state = %d", code)
	}
	if _, page := e.envGet(e.browser(r.Viewer), listPage); !strings.Contains(page, "ask an instance administrator") {
		t.Fatal("viewer empty state does not say whom to ask")
	}
	if _, page := e.envGet(admin, listPage+"?driver=ssh"); !strings.Contains(page, `name="host_key"`) || !strings.Contains(page, `value="ssh" selected`) {
		t.Fatal("?driver=ssh does not show the ssh fields")
	}

	// Validation failure: 422 with field messages, nothing written, the pasted key not echoed.
	resp, page := e.envForm(admin, listPage, url.Values{"name": {"remote"}, "driver": {"ssh"}, "host": {"ssh://x"},
		"user": {"deploy"}, "private_key": {k.Private}, "host_key": {k.Public}, "secret_env": {"TOKEN=abc"}}, false)
	if resp.StatusCode != 422 || !strings.Contains(page, "without a scheme") || strings.Contains(page, k.Marker) || strings.Contains(page, "abc") {
		t.Fatalf("invalid create form = %d", resp.StatusCode)
	}
	resp, page = e.envForm(admin, listPage, url.Values{"name": {"remote"}, "driver": {"ssh"}, "host": {"x"}, "port": {"many"}}, true)
	if resp.StatusCode != 422 || !strings.Contains(page, "must be a number") {
		t.Fatalf("htmx invalid create form = %d, want 422 with the messages", resp.StatusCode)
	}
	resp, page = e.envForm(admin, listPage, url.Values{"name": {"local"}, "driver": {"local"}, "env": {"NOEQUALS"}}, false)
	if resp.StatusCode != 422 || !strings.Contains(page, "line 1: write NAME=value") {
		t.Fatalf("bad env line = %d", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM environments`); n != 0 {
		t.Fatalf("refused forms wrote %d environments", n)
	}

	// Create: local with variables, then ssh.
	resp, _ = e.envForm(admin, listPage, url.Values{"name": {"Local box"}, "driver": {"local"},
		"env": {"MODE=ci\r\nEMPTY="}, "secret_env": {"TOKEN=abc"}}, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("create local = %d", resp.StatusCode)
	}
	localID := strings.TrimPrefix(resp.Header.Get("Location"), "/environments/")
	if code, out := e.call(r.Admin, http.MethodGet, "/api/environments/"+localID, nil); code != 200 ||
		len(out["config"].(map[string]any)["env"].([]any)) != 3 {
		t.Fatalf("created local = %d %v", code, out)
	}
	resp, _ = e.envForm(admin, listPage, url.Values{"name": {"remote"}, "driver": {"ssh"}, "host": {"build-1"}, "port": {"2222"},
		"user": {"deploy"}, "private_key": {k.Private}, "host_key": {k.Public}}, true)
	if resp.StatusCode != http.StatusOK || !strings.HasPrefix(resp.Header.Get("HX-Redirect"), "/environments/") {
		t.Fatalf("htmx create ssh = %d %q", resp.StatusCode, resp.Header.Get("HX-Redirect"))
	}
	sshID := strings.TrimPrefix(resp.Header.Get("HX-Redirect"), "/environments/")
	var sealedBefore []byte
	if err := e.pool.QueryRow(context.Background(), `SELECT secrets FROM environments WHERE id = $1`, sshID).Scan(&sealedBefore); err != nil {
		t.Fatal(err)
	}

	// The edit form never carries the key; leaving it empty keeps it; secret lines with a name keep the value.
	_, page = e.envGet(admin, "/environments/"+sshID)
	if !strings.Contains(page, "leave empty to keep the current key") && !strings.Contains(page, "Leave empty to keep the current key") {
		t.Fatal("edit form lacks the keep-the-key hint")
	}
	if strings.Contains(page, k.Marker) {
		t.Fatal("edit form renders the key")
	}
	resp, _ = e.envForm(admin, "/environments/"+sshID, url.Values{"name": {"remote"}, "driver": {"ssh"}, "host": {"build-1"},
		"port": {"2200"}, "user": {"deploy"}, "host_key": {k.Public}}, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit ssh = %d", resp.StatusCode)
	}
	var sealedAfter []byte
	if err := e.pool.QueryRow(context.Background(), `SELECT secrets FROM environments WHERE id = $1`, sshID).Scan(&sealedAfter); err != nil {
		t.Fatal(err)
	}
	plain, err := e.srv.secrets.Open(sealedAfter, "environment:"+sshID)
	if err != nil || !bytes.Contains(plain, []byte(k.Marker)) || !bytes.Equal(sealedBefore, sealedAfter) {
		t.Fatalf("the stored key was not kept: %v", err)
	}
	_, page = e.envGet(admin, "/environments/"+localID)
	if !strings.Contains(page, ">TOKEN</textarea>") || !strings.Contains(page, "MODE=ci") || strings.Contains(page, "TOKEN=abc") {
		t.Fatal("edit form does not list the secret by name only, or lacks the plain variables")
	}
	resp, _ = e.envForm(admin, "/environments/"+localID, url.Values{"name": {"Local box"}, "driver": {"local"}, "env": {"MODE=ci\nEMPTY="}, "secret_env": {"TOKEN"}}, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("edit local = %d", resp.StatusCode)
	}
	var sealed []byte
	if err := e.pool.QueryRow(context.Background(), `SELECT secrets FROM environments WHERE id = $1`, localID).Scan(&sealed); err != nil {
		t.Fatal(err)
	}
	if plain, err := e.srv.secrets.Open(sealed, "environment:"+localID); err != nil || !bytes.Contains(plain, []byte(`"TOKEN":"abc"`)) {
		t.Fatalf("secret variable not kept: %v", err)
	}

	// htmx edit: success swaps the fresh page in; a refusal answers 409 or 422 with the messages.
	resp, page = e.envForm(admin, "/environments/"+localID, url.Values{"name": {"Local box 2"}, "driver": {"local"}, "secret_env": {"TOKEN"}}, true)
	if resp.StatusCode != 200 || !strings.Contains(page, `id="environment-page"`) || !strings.Contains(page, "Local box 2") {
		t.Fatalf("htmx edit = %d", resp.StatusCode)
	}
	resp, page = e.envForm(admin, "/environments/"+localID, url.Values{"name": {"remote"}, "driver": {"local"}, "secret_env": {"TOKEN"}}, false)
	if resp.StatusCode != 409 || !strings.Contains(page, "already used") {
		t.Fatalf("rename onto a taken name = %d", resp.StatusCode)
	}
	resp, _ = e.envForm(admin, "/environments/"+localID, url.Values{"name": {"x"}, "driver": {"ssh"}}, false)
	if resp.StatusCode != 422 {
		t.Fatalf("switch to ssh without settings = %d, want 422", resp.StatusCode)
	}
	if n := e.count(`SELECT count(*) FROM environments WHERE id = $1 AND name = 'Local box 2' AND driver = 'local'`, localID); n != 1 {
		t.Fatal("refused edits changed the environment")
	}

	// Sandbox through the form: the checkboxes and limits arrive typed.
	resp, _ = e.envForm(admin, listPage, url.Values{"name": {"box"}, "driver": {"sandbox"}, "sandbox_fields": {"1"},
		"network": {"on"}, "memory_mb": {"2048"}, "cpus": {"1.5"}, "pids_max": {""}, "timeout_s": {"60"}}, false)
	if resp.StatusCode != http.StatusSeeOther {
		t.Fatalf("create sandbox = %d", resp.StatusCode)
	}
	boxID := strings.TrimPrefix(resp.Header.Get("Location"), "/environments/")
	_, out := e.call(r.Admin, http.MethodGet, "/api/environments/"+boxID, nil)
	cfg := out["config"].(map[string]any)
	if cfg["network"] != true || cfg["setup_network"] != false || cfg["memory_mb"] != 2048.0 || cfg["cpus"] != 1.5 || cfg["pids_max"] != 512.0 || cfg["timeout_s"] != 60.0 {
		t.Fatalf("sandbox from form = %v", cfg)
	}
}

func TestEnvironmentDBLookups(t *testing.T) {
	t.Parallel()
	e := setup(t)
	r := e.roles()
	ctx := context.Background()
	a := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "b-local", "driver": "local"})["id"].(string)
	q := e.envCreate(r.Admin, r.A.ID, map[string]any{"name": "a-box", "driver": "sandbox"})["id"].(string)
	if _, err := e.pool.Exec(ctx, `UPDATE environments SET qualification = '{"ok": true}' WHERE id = $1`, q); err != nil {
		t.Fatal(err)
	}
	if _, err := db.EnvironmentByID(ctx, e.pool, r.B.ID, a); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company's environment by id: %v", err)
	}
	if env, err := db.EnvironmentByID(ctx, e.pool, r.A.ID, a); err != nil || env.Name != "b-local" {
		t.Fatalf("EnvironmentByID = %+v, %v", env, err)
	}
	list, err := db.EnvironmentSummaries(ctx, e.pool, r.A.ID)
	if err != nil {
		t.Fatal(err)
	}
	want := []db.EnvironmentSummary{{ID: q, Name: "a-box", Driver: "sandbox", Status: "active", Qualified: true},
		{ID: a, Name: "b-local", Driver: "local", Status: "active", Qualified: false}}
	if len(list) != 2 || list[0] != want[0] || list[1] != want[1] {
		t.Fatalf("summaries = %+v, want %+v", list, want)
	}
	if other, err := db.EnvironmentSummaries(ctx, e.pool, r.B.ID); err != nil || len(other) != 0 {
		t.Fatalf("company B sees %v, %v", other, err)
	}
}
