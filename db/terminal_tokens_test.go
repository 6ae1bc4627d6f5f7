package db_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"sync"
	"testing"
	"time"

	"berth/db"
)

// TestTerminalTokens: a token is consumed once, even by concurrent presentations; expired and
// unknown tokens are refused alike; the ttl is capped at 60 s.
func TestTerminalTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newImageWorld(t)
	var user string
	if err := w.pool.QueryRow(ctx, `INSERT INTO users (email, password_hash, is_instance_admin) VALUES ('a@x.test', 'x', true) RETURNING id`).Scan(&user); err != nil {
		t.Fatal(err)
	}
	if _, err := db.CreateImageVersion(ctx, w.pool, db.NewImageVersion{CompanyID: w.companyA, EnvironmentID: w.envA,
		Digest: w.emptyDigest, Status: db.ImageActive}); err != nil {
		t.Fatal(err)
	}
	sess, err := db.CreateSetupSession(ctx, w.pool, db.NewSetupSession{CompanyID: w.companyA, EnvironmentID: w.envA, BaseVersion: 1,
		UserID: user, TTL: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	bind := db.TerminalToken{CompanyID: w.companyA, SessionID: sess.ID, UserID: user, EnvironmentID: w.envA}
	hash := sha256.Sum256([]byte("token-1"))
	exp, err := db.InsertTerminalToken(ctx, w.pool, hash, bind, time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	if d := time.Until(exp); d > 61*time.Second || d < 30*time.Second {
		t.Fatalf("expiry in %v, want the 60 s cap", d)
	}
	var wg sync.WaitGroup
	results := make(chan error, 8)
	for range 8 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := db.ConsumeTerminalToken(ctx, w.pool, hash)
			if err == nil && (got.SessionID != sess.ID || got.UserID != user || got.EnvironmentID != w.envA) {
				err = errors.New("wrong binding")
			}
			results <- err
		}()
	}
	wg.Wait()
	close(results)
	ok := 0
	for err := range results {
		switch {
		case err == nil:
			ok++
		case !errors.Is(err, db.ErrTokenRefused):
			t.Fatal(err)
		}
	}
	if ok != 1 {
		t.Fatalf("%d presentations succeeded, want exactly 1", ok)
	}
	if _, err := db.ConsumeTerminalToken(ctx, w.pool, sha256.Sum256([]byte("never minted"))); !errors.Is(err, db.ErrTokenRefused) {
		t.Fatalf("unknown token: %v", err)
	}
	old := sha256.Sum256([]byte("token-old"))
	if _, err := w.pool.Exec(ctx, `INSERT INTO terminal_tokens (token_hash, company_id, session_id, user_id, environment_id, created_at, expires_at)
		VALUES ($1, $2, $3, $4, $5, now() - interval '2 hours', now() - interval '119 minutes')`, old[:], w.companyA, sess.ID, user, w.envA); err != nil {
		t.Fatal(err)
	}
	if _, err := db.ConsumeTerminalToken(ctx, w.pool, old); !errors.Is(err, db.ErrTokenRefused) {
		t.Fatalf("expired token: %v", err)
	}
	if n, err := db.PruneTerminalTokens(ctx, w.pool); err != nil || n != 1 {
		t.Fatalf("prune = %d %v, want the expired one", n, err)
	}
	if _, err := w.pool.Exec(ctx, `INSERT INTO terminal_tokens (token_hash, company_id, session_id, user_id, environment_id, expires_at)
		VALUES ($1, $2, $3, $4, $5, now() + interval '2 minutes')`, old[:], w.companyA, sess.ID, user, w.envA); err == nil {
		t.Fatal("a token living longer than 60 s was stored")
	}
}

// TestActivateImageVersion: activation moves the one active version; failed versions and other
// companies' are refused.
func TestActivateImageVersion(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newImageWorld(t)
	for _, st := range []string{db.ImageActive, db.ImageAvailable} {
		if _, err := db.CreateImageVersion(ctx, w.pool, db.NewImageVersion{CompanyID: w.companyA, EnvironmentID: w.envA,
			Digest: w.emptyDigest, Status: st}); err != nil {
			t.Fatal(err)
		}
	}
	prev, cur, err := db.ActivateImageVersion(ctx, w.pool, w.companyA, w.envA, 2)
	if err != nil || prev.Number != 1 || cur.Number != 2 || cur.Status != db.ImageActive {
		t.Fatalf("activate 2 = %+v %+v %v", prev, cur, err)
	}
	if v, _ := db.ActiveImageVersion(ctx, w.pool, w.companyA, w.envA); v.Number != 2 {
		t.Fatalf("active = %d", v.Number)
	}
	if _, _, err := db.ActivateImageVersion(ctx, w.pool, w.companyB, w.envA, 1); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("another company: %v", err)
	}
	if _, _, err := db.ActivateImageVersion(ctx, w.pool, w.companyA, w.envA, 9); !errors.Is(err, db.ErrNotFound) {
		t.Fatalf("unknown version: %v", err)
	}
	if _, err := w.pool.Exec(ctx, `UPDATE image_versions SET status = 'failed' WHERE environment_id = $1 AND number = 1`, w.envA); err != nil {
		t.Fatal(err)
	}
	if _, _, err := db.ActivateImageVersion(ctx, w.pool, w.companyA, w.envA, 1); !errors.Is(err, db.ErrConflict) {
		t.Fatalf("failed version: %v", err)
	}
}
