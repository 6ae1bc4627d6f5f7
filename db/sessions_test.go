package db_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/alexedwards/scs/v2"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
)

// The store is what scs needs, and scs passes it request contexts.
var _ scs.CtxStore = (*db.SessionStore)(nil)

// storedTokens returns the token column of every row in sessions.
func storedTokens(t *testing.T, pool *pgxpool.Pool) []string {
	t.Helper()
	rows, err := pool.Query(context.Background(), `SELECT token FROM sessions ORDER BY token`)
	if err != nil {
		t.Fatal(err)
	}
	defer rows.Close()
	var out []string
	for rows.Next() {
		var tok string
		if err := rows.Scan(&tok); err != nil {
			t.Fatal(err)
		}
		out = append(out, tok)
	}
	if err := rows.Err(); err != nil {
		t.Fatal(err)
	}
	return out
}

func sha256Hex(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

// TestSessionStoreHashesTokens: a committed session is found by its token, the row holds the
// token's sha256 and never the token, a second commit replaces it, and delete removes it.
func TestSessionStoreHashesTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	store := db.NewSessionStore(pool)
	const token = "k3Vd0bq1lC9x2HcZJ5uYwq8sT7aRnE4mPfG6oLiU0eA"

	if err := store.CommitCtx(ctx, token, []byte("first"), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	data, found, err := store.FindCtx(ctx, token)
	if err != nil || !found || string(data) != "first" {
		t.Fatalf("find after commit: %q %v %v", data, found, err)
	}
	if got := storedTokens(t, pool); len(got) != 1 || got[0] != sha256Hex(token) {
		t.Fatalf("stored token column %q, want only sha256(token) %q", got, sha256Hex(token))
	}

	// A hash is not a token: presenting the stored value finds nothing.
	if _, found, err := store.FindCtx(ctx, sha256Hex(token)); err != nil || found {
		t.Fatalf("find by the stored hash: found=%v err=%v", found, err)
	}

	if err := store.Commit(token, []byte("second"), time.Now().Add(2*time.Hour)); err != nil {
		t.Fatal(err)
	}
	if data, found, err := store.Find(token); err != nil || !found || string(data) != "second" {
		t.Fatalf("find after recommit: %q %v %v", data, found, err)
	}
	if got := storedTokens(t, pool); len(got) != 1 {
		t.Fatalf("recommit left %d rows, want 1", len(got))
	}

	if err := store.DeleteCtx(ctx, token); err != nil {
		t.Fatal(err)
	}
	if _, found, err := store.Find(token); err != nil || found {
		t.Fatalf("find after delete: found=%v err=%v", found, err)
	}
	if got := storedTokens(t, pool); len(got) != 0 {
		t.Fatalf("delete left rows %q", got)
	}
	if err := store.Delete(token); err != nil {
		t.Fatalf("deleting an unknown token: %v", err)
	}
}

// TestSessionStoreFind covers what Find must not return, each with found=false and no error.
func TestSessionStoreFind(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	store := db.NewSessionStore(pool)
	if err := store.CommitCtx(ctx, "live", []byte("live data"), time.Now().Add(time.Hour)); err != nil {
		t.Fatal(err)
	}
	if err := store.CommitCtx(ctx, "expired", []byte("old data"), time.Now().Add(-time.Second)); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, token string
		want        string // "" means not found
	}{
		{"live", "live", "live data"},
		{"expired", "expired", ""},
		{"unknown", "nobody", ""},
		{"empty", "", ""},
		{"stored hash", sha256Hex("live"), ""},
		{"not utf-8", "\xff\xfe", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			data, found, err := store.FindCtx(ctx, tc.token)
			if err != nil {
				t.Fatalf("find: %v", err)
			}
			if found != (tc.want != "") || string(data) != tc.want {
				t.Fatalf("find %q: %q found=%v, want %q", tc.token, data, found, tc.want)
			}
		})
	}
	// Expired rows stay until housekeeping prunes them; they are only invisible.
	if got := storedTokens(t, pool); len(got) != 2 {
		t.Fatalf("%d rows, want the live and the expired one", len(got))
	}
}

// TestSessionStoreWithSessionManager runs the store under scs as the handlers do: the cookie's
// token reloads the session, and the database never holds the cookie's value.
func TestSessionStoreWithSessionManager(t *testing.T) {
	t.Parallel()
	pool := dbtest.New(t)
	sm := scs.New()
	sm.Store = db.NewSessionStore(pool)
	h := sm.LoadAndSave(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/login":
			sm.Put(r.Context(), "user", "u-1")
		case "/logout":
			if err := sm.Destroy(r.Context()); err != nil {
				t.Errorf("destroy: %v", err)
			}
		}
		_, _ = w.Write([]byte(sm.GetString(r.Context(), "user")))
	}))
	do := func(path string, cookie *http.Cookie) *httptest.ResponseRecorder {
		req := httptest.NewRequest(http.MethodGet, path, nil)
		if cookie != nil {
			req.AddCookie(cookie)
		}
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, req)
		return rec
	}

	rec := do("/login", nil)
	var cookie *http.Cookie
	for _, c := range rec.Result().Cookies() {
		if c.Name == sm.Cookie.Name {
			cookie = c
		}
	}
	if cookie == nil || cookie.Value == "" {
		t.Fatalf("login set no session cookie: %v", rec.Result().Cookies())
	}
	if got := storedTokens(t, pool); len(got) != 1 || got[0] != sha256Hex(cookie.Value) || strings.Contains(got[0], cookie.Value) {
		t.Fatalf("stored %q for cookie %q, want only its sha256", got, cookie.Value)
	}
	if rec := do("/", cookie); rec.Body.String() != "u-1" {
		t.Fatalf("reload with the cookie read %q, want u-1", rec.Body.String())
	}
	if rec := do("/", &http.Cookie{Name: sm.Cookie.Name, Value: sha256Hex(cookie.Value)}); rec.Body.Len() != 0 {
		t.Fatalf("the stored hash as a cookie read %q, want nothing", rec.Body.String())
	}
	do("/logout", cookie)
	if rec := do("/", cookie); rec.Body.Len() != 0 {
		t.Fatalf("after logout the cookie read %q", rec.Body.String())
	}
	if got := storedTokens(t, pool); len(got) != 0 {
		t.Fatalf("logout left rows %q", got)
	}
}

// TestSessionMigrationDropsPlainTokens: migration 0005 deletes the rows written before it, which
// are keyed by plain tokens.
func TestSessionMigrationDropsPlainTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	// A database as it was before 0005: a plain-token row, and no 0005 in the ledger.
	if _, err := pool.Exec(ctx, `DELETE FROM berth_migrations WHERE version = 5`); err != nil {
		t.Fatal(err)
	}
	if _, err := pool.Exec(ctx, `INSERT INTO sessions (token, data, expiry) VALUES ('plain-live-token', '\x00', now() + interval '1 hour')`); err != nil {
		t.Fatal(err)
	}
	if err := db.Migrate(ctx, pool, quiet()); err != nil {
		t.Fatal(err)
	}
	if got := storedTokens(t, pool); len(got) != 0 {
		t.Fatalf("rows left after 0005: %q", got)
	}
	var name string
	if err := pool.QueryRow(ctx, `SELECT name FROM berth_migrations WHERE version = 5`).Scan(&name); err != nil || name != "sessions_hashed" {
		t.Fatalf("ledger for 0005: %q %v", name, err)
	}
}

// TestSessionStoreSkipsExpiryOnlySaves: a save of the data this process last saw, moving the
// expiry on by less than a minute, writes nothing (scs saves every request for its idle
// timeout); a larger move, new data, or data another process wrote meanwhile is written.
func TestSessionStoreSkipsExpiryOnlySaves(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	pool := dbtest.New(t)
	store := db.NewSessionStore(pool)
	stored := func() (string, time.Time) {
		t.Helper()
		var data []byte
		var expiry time.Time
		if err := pool.QueryRow(ctx, `SELECT data, expiry FROM sessions WHERE token = $1`, sha256Hex("tok")).Scan(&data, &expiry); err != nil {
			t.Fatal(err)
		}
		return string(data), expiry
	}
	t0 := time.Now().Add(time.Hour).Truncate(time.Millisecond)
	commit := func(data string, expiry time.Time) {
		t.Helper()
		if err := store.CommitCtx(ctx, "tok", []byte(data), expiry); err != nil {
			t.Fatal(err)
		}
	}
	commit("a", t0)
	commit("a", t0.Add(10*time.Second))
	if _, e := stored(); !e.Equal(t0) {
		t.Fatalf("an expiry-only save 10 s on was written: %v, want %v", e, t0)
	}
	commit("a", t0.Add(2*time.Minute))
	if _, e := stored(); !e.Equal(t0.Add(2 * time.Minute)) {
		t.Fatalf("a save 2 min on was skipped: %v", e)
	}
	commit("b", t0.Add(2*time.Minute+time.Second))
	if d, _ := stored(); d != "b" {
		t.Fatalf("new data was skipped: %q", d)
	}
	// Another process writes "c"; this one loads it, and saving its own earlier "b" again must
	// be written, not skipped as "what it wrote".
	if _, err := pool.Exec(ctx, `UPDATE sessions SET data = 'c' WHERE token = $1`, sha256Hex("tok")); err != nil {
		t.Fatal(err)
	}
	if data, found, err := store.FindCtx(ctx, "tok"); err != nil || !found || string(data) != "c" {
		t.Fatalf("find = %q %v %v", data, found, err)
	}
	commit("b", t0.Add(2*time.Minute+2*time.Second))
	if d, _ := stored(); d != "b" {
		t.Fatalf("a save over another process's data was skipped: %q", d)
	}
	// After a delete, a save is written.
	if err := store.DeleteCtx(ctx, "tok"); err != nil {
		t.Fatal(err)
	}
	commit("b", t0.Add(2*time.Minute+3*time.Second))
	if d, _ := stored(); d != "b" {
		t.Fatalf("after delete: %q", d)
	}
}
