package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"testing"

	"berth/db"
)

// token gives a user a new API token.
func (e *testEnv) token(userID string) string {
	e.t.Helper()
	tok, hash, err := db.NewToken()
	if err != nil {
		e.t.Fatal(err)
	}
	if _, err := db.CreateUserToken(context.Background(), e.pool, userID, "test", hash); err != nil {
		e.t.Fatal(err)
	}
	return tok
}

func decodeError(t *testing.T, resp *http.Response) (code, message string) {
	t.Helper()
	var body struct {
		Error struct {
			Code    string `json:"code"`
			Message string `json:"message"`
		} `json:"error"`
	}
	if ct := resp.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("error content type = %q", ct)
	}
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil {
		t.Fatalf("error body: %v", err)
	}
	return body.Error.Code, body.Error.Message
}

func TestMeWithToken(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	u := e.user("ada@example.com", "correct horse battery", true)
	co, err := db.CreateCompany(ctx, e.pool, "Acme", "acme")
	if err != nil {
		t.Fatal(err)
	}
	if err := db.PutMembership(ctx, e.pool, co.ID, u.ID, "board"); err != nil {
		t.Fatal(err)
	}
	tok := e.token(u.ID)

	resp := e.do(e.client(), http.MethodGet, "/api/me", nil, map[string]string{"Authorization": "Bearer " + tok})
	if resp.StatusCode != http.StatusOK {
		t.Fatalf("/api/me = %d", resp.StatusCode)
	}
	var me meResponse
	if err := json.NewDecoder(resp.Body).Decode(&me); err != nil {
		t.Fatal(err)
	}
	want := meResponse{ID: u.ID, Email: "ada@example.com", IsInstanceAdmin: true,
		Memberships: []meMembership{{CompanyID: co.ID, Slug: "acme", Role: "board"}}}
	if me.ID != want.ID || me.Email != want.Email || !me.IsInstanceAdmin || len(me.Memberships) != 1 || me.Memberships[0] != want.Memberships[0] {
		t.Fatalf("/api/me = %+v, want %+v", me, want)
	}
	if n := e.count(`SELECT count(*) FROM api_tokens WHERE user_id = $1 AND last_used_at IS NOT NULL`, u.ID); n != 1 {
		t.Fatal("last_used_at was not recorded")
	}
	if resp.Header.Get("Set-Cookie") != "" {
		t.Fatal("a token request created a session cookie")
	}
}

func TestTokenRefusals(t *testing.T) {
	t.Parallel()
	e := setup(t)
	ctx := context.Background()
	u := e.user("ada@example.com", "correct horse battery", false)
	revoked := e.token(u.ID)
	if _, err := e.pool.Exec(ctx, `UPDATE api_tokens SET revoked_at = now()`); err != nil {
		t.Fatal(err)
	}
	expired := e.token(u.ID)
	if _, err := e.pool.Exec(ctx, `UPDATE api_tokens SET expires_at = now() - interval '1 second' WHERE revoked_at IS NULL`); err != nil {
		t.Fatal(err)
	}
	gone := e.user("gone@example.com", "correct horse battery", false)
	disabledTok := e.token(gone.ID)
	if _, err := e.pool.Exec(ctx, `UPDATE users SET disabled_at = now() WHERE id = $1`, gone.ID); err != nil {
		t.Fatal(err)
	}
	for name, authz := range map[string]string{
		"none":          "",
		"unknown":       "Bearer berth_notarealtokenatall",
		"revoked":       "Bearer " + revoked,
		"expired":       "Bearer " + expired,
		"disabled user": "Bearer " + disabledTok,
		"basic scheme":  "Basic YWRhOnB3",
		"empty bearer":  "Bearer ",
	} {
		resp := e.do(e.client(), http.MethodGet, "/api/me", nil, map[string]string{"Authorization": authz})
		if resp.StatusCode != http.StatusUnauthorized {
			t.Errorf("%s: /api/me = %d, want 401", name, resp.StatusCode)
			continue
		}
		if code, _ := decodeError(t, resp); code != "unauthorized" {
			t.Errorf("%s: error code %q", name, code)
		}
	}
}

func TestHealth(t *testing.T) {
	t.Parallel()
	e := setup(t)
	resp := e.do(e.client(), http.MethodGet, "/api/health", nil, nil)
	var body map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&body); err != nil || resp.StatusCode != http.StatusOK || body["status"] != "ok" {
		t.Fatalf("health = %d %v (%v)", resp.StatusCode, body, err)
	}
	// Health checks over its own connection, not the pool: a database that does not answer is
	// TestDatabaseUnavailable, an exhausted pool TestPoolExhausted (dbavail_test.go).
}
