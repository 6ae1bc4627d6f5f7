package backup

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
	"berth/db/dbtest"
	"berth/environment/datadir"
)

func TestMain(m *testing.M) { dbtest.Main(m) }

// world is a source instance: a database with work in it and a data dir with artifacts and a layer.
type world struct {
	conn, data string
	pool       *pgxpool.Pool
	key        []byte
	company    string
	liveRun    string
	lease      string
	workspace  string
	envID      string
	layerDirFn func(string, int) string
}

func layerDirIn(data string) func(string, int) string {
	return func(env string, n int) string { return filepath.Join(data, "images", env, strconv.Itoa(n)) }
}

func newWorld(t testing.TB, runs int) *world {
	t.Helper()
	ctx := context.Background()
	w := &world{conn: dbtest.ConnString(t), data: t.TempDir(), key: bytes.Repeat([]byte{7}, 32)}
	w.layerDirFn = layerDirIn(w.data)
	pool, err := db.Open(ctx, w.conn)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(pool.Close)
	w.pool = pool
	q := func(sql string, args ...any) string {
		t.Helper()
		var id string
		if err := pool.QueryRow(ctx, sql, args...).Scan(&id); err != nil {
			t.Fatalf("%s: %v", sql, err)
		}
		return id
	}
	w.company = q(`INSERT INTO companies (name, slug) VALUES ('Acme', 'acme') RETURNING id`)
	project := q(`INSERT INTO projects (company_id, name, key) VALUES ($1, 'P', 'PRJ') RETURNING id`, w.company)
	task := q(`INSERT INTO tasks (company_id, project_id, number, key, title) VALUES ($1, $2, 1, 'PRJ-1', 'T') RETURNING id`, w.company, project)
	w.envID = q(`INSERT INTO environments (company_id, name, driver) VALUES ($1, 'box', 'sandbox') RETURNING id`, w.company)
	q(`INSERT INTO runs (company_id, task_id, status, command, log, log_bytes, finished_at)
		SELECT $1, $2, 'succeeded', 'echo ' || i, convert_to(repeat('line of output ' || i || E'\n', 200), 'UTF8'), 4000, now()
		FROM generate_series(1, $3::int) i RETURNING 'x'`, w.company, task, runs)
	w.workspace = q(`INSERT INTO execution_workspaces (company_id, project_id, mode, strategy, status, ref, branch)
		VALUES ($1, $2, 'isolated', 'git_worktree', 'ready', 'ws-' || md5(random()::text), 'berth/PRJ-1') RETURNING id`, w.company, project)
	w.lease = q(`INSERT INTO environment_leases (company_id, environment_id, execution_workspace_id, status, acquired_at, heartbeat_at)
		VALUES ($1, $2, $3, 'active', now(), now()) RETURNING id`, w.company, w.envID, w.workspace)
	w.liveRun = q(`INSERT INTO runs (company_id, task_id, status, command, execution_workspace_id, lease_id, started_at)
		VALUES ($1, $2, 'running', 'sleep 300', $3, $4, now()) RETURNING id`, w.company, task, w.workspace, w.lease)
	// A layer: files, a directory, a symlink, an executable.
	layer := w.layerDirFn(w.envID, 7)
	mustWrite(t, filepath.Join(layer, "etc", "motd"), "hello\n", 0o644)
	mustWrite(t, filepath.Join(layer, "usr", "bin", "tool"), "#!/bin/sh\necho tool\n", 0o755)
	if err := os.Symlink("usr/bin", filepath.Join(layer, "bin")); err != nil {
		t.Fatal(err)
	}
	q(`INSERT INTO image_versions (company_id, environment_id, number, digest, size, status)
		VALUES ($1, $2, 7, 'sha256:' || repeat('a', 64), 10, 'available') RETURNING id`, w.company, w.envID)
	for i := 0; i < 3; i++ {
		w.artifact(t, fmt.Sprintf("artifact %d\n", i))
	}
	return w
}

func (w *world) artifact(t testing.TB, content string) string {
	sum := sha256.Sum256([]byte(content))
	name := hex.EncodeToString(sum[:])
	mustWrite(t, filepath.Join(w.data, "artifacts", name), content, 0o444)
	return name
}

func mustWrite(t testing.TB, path, content string, mode os.FileMode) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), mode); err != nil {
		t.Fatal(err)
	}
}

func (w *world) backup(t testing.TB, dir, keyOut string) Manifest {
	t.Helper()
	res, err := Backup(context.Background(), Options{Dir: dir, ConnString: w.conn, Source: "database_url", Data: datadir.At(w.data),
		Key: w.key, KeyOut: keyOut, BerthVersion: "test"})
	if err != nil {
		t.Fatalf("backup: %v", err)
	}
	return res.Manifest
}

func restoreOpts(dir, conn, data, keyFile string) RestoreOptions {
	return RestoreOptions{Dir: dir, Data: datadir.At(data), KeyFile: keyFile,
		OpenDatabase: func(context.Context) (string, func(), error) { return conn, func() {}, nil }}
}

// tree lists a directory's entries with their type, mode, and content or link target.
func tree(t *testing.T, dir string) string {
	t.Helper()
	var b strings.Builder
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		if rel == "." {
			return nil // the directories themselves are made by their stores
		}
		fi, _ := os.Lstat(p)
		fmt.Fprintf(&b, "%s %v", rel, fi.Mode())
		switch {
		case fi.Mode()&fs.ModeSymlink != 0:
			l, _ := os.Readlink(p)
			fmt.Fprintf(&b, " -> %s", l)
		case fi.Mode().IsRegular():
			c, _ := os.ReadFile(p)
			fmt.Fprintf(&b, " %q", c)
		}
		b.WriteString("\n")
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return b.String()
}

func TestBackupRestoreRoundTrip(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 20)
	dir := filepath.Join(t.TempDir(), "backup")
	keyOut := filepath.Join(t.TempDir(), "berth.key")
	m := w.backup(t, dir, keyOut)
	if len(m.LiveRuns) != 1 || m.LiveRuns[0].ID != w.liveRun || len(m.OpenWorkspaces) != 1 || m.OpenWorkspaces[0].Branch != "berth/PRJ-1" ||
		len(m.Images) != 1 || len(m.Artifacts) != 3 || m.Rows["runs"] != 21 || m.Key.Mode != "separate" {
		t.Fatalf("manifest: live %v, open %v, images %v, artifacts %d, rows %v, key %v", m.LiveRuns, m.OpenWorkspaces, m.Images,
			len(m.Artifacts), m.Rows, m.Key)
	}
	if m.Stats.CopiedBlobs != 5 || m.Stats.ReusedBlobs != 0 {
		t.Fatalf("first backup stats %+v: want 5 blobs copied (dump, layer, 3 artifacts)", m.Stats)
	}
	if fi, err := os.Stat(keyOut); err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("key file: %v %v", fi, err)
	}
	// Nothing of the key is in the backup directory.
	hexKey := hex.EncodeToString(w.key)
	_ = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err == nil && d.Type().IsRegular() {
			if c, _ := os.ReadFile(p); bytes.Contains(c, w.key) || bytes.Contains(c, []byte(hexKey)) {
				t.Errorf("%s contains the secret key", p)
			}
		}
		return nil
	})

	// Incremental: only the new dump and the new artifact are copied. New work changes the
	// dump (two dumps of an unchanged database within one second are the same bytes, and then
	// rightly reused: pg_dump's header time has second resolution).
	if _, err := w.pool.Exec(ctx, `INSERT INTO projects (company_id, name, key) VALUES ($1, 'Q', 'QRJ')`, w.company); err != nil {
		t.Fatal(err)
	}
	added := w.artifact(t, "a fourth artifact\n")
	m2 := w.backup(t, dir, keyOut)
	if m2.Stats.CopiedBlobs != 2 || m2.Stats.ReusedBlobs != 4 || len(m2.Artifacts) != 4 {
		t.Fatalf("second backup stats %+v, %d artifacts: want 2 copied (dump, %s), 4 reused", m2.Stats, len(m2.Artifacts), added[:8])
	}

	target, data := dbtest.EmptyConnString(t), filepath.Join(t.TempDir(), "restored")
	res, err := Restore(ctx, restoreOpts(dir, target, data, keyOut))
	if err != nil {
		t.Fatalf("restore: %v", err)
	}
	if res.Settled.Runs != 1 || res.Settled.Leases != 1 || res.Settled.Workspaces != 1 {
		t.Fatalf("settled %+v", res.Settled)
	}
	pool, err := db.Open(ctx, target)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	var status, code, msg, leaseStatus, wsStatus string
	if err := pool.QueryRow(ctx, `SELECT status, error_code, error_message FROM runs WHERE id = $1`, w.liveRun).Scan(&status, &code, &msg); err != nil {
		t.Fatal(err)
	}
	if status != "failed" || code != "orphaned" || !strings.Contains(msg, "was running then") {
		t.Fatalf("live run after restore: %s/%s %q", status, code, msg)
	}
	_ = pool.QueryRow(ctx, `SELECT status FROM environment_leases WHERE id = $1`, w.lease).Scan(&leaseStatus)
	_ = pool.QueryRow(ctx, `SELECT status FROM execution_workspaces WHERE id = $1`, w.workspace).Scan(&wsStatus)
	if leaseStatus != "released" || wsStatus != "closed" {
		t.Fatalf("lease %s, workspace %s after restore", leaseStatus, wsStatus)
	}
	var live int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM runs WHERE status IN ('queued', 'preparing', 'running')`).Scan(&live)
	var succeeded int
	_ = pool.QueryRow(ctx, `SELECT count(*) FROM runs WHERE status = 'succeeded' AND length(log) > 0`).Scan(&succeeded)
	if live != 0 || succeeded != 20 {
		t.Fatalf("after restore: %d live runs, %d succeeded with logs", live, succeeded)
	}
	if got, want := tree(t, layerDirIn(data)(w.envID, 7)), tree(t, w.layerDirFn(w.envID, 7)); got != want {
		t.Fatalf("restored layer:\n%s\nwant:\n%s", got, want)
	}
	if got, want := tree(t, filepath.Join(data, "artifacts")), tree(t, filepath.Join(w.data, "artifacts")); got != want {
		t.Fatalf("restored artifacts:\n%s\nwant:\n%s", got, want)
	}
	if c, err := os.ReadFile(filepath.Join(data, "secret.key")); err != nil || strings.TrimSpace(string(c)) != hexKey {
		t.Fatalf("restored key file: %v", err)
	}
}

func TestPassphraseSealedKey(t *testing.T) {
	t.Parallel()
	w := newWorld(t, 1)
	dir := filepath.Join(t.TempDir(), "backup")
	pass := filepath.Join(t.TempDir(), "pass")
	mustWrite(t, pass, "correct horse battery staple\n", 0o600)
	_, err := Backup(context.Background(), Options{Dir: dir, ConnString: w.conn, Data: datadir.At(w.data), Key: w.key,
		PassphraseFile: pass})
	if err != nil {
		t.Fatal(err)
	}
	wrong := filepath.Join(t.TempDir(), "wrong")
	mustWrite(t, wrong, "incorrect horse battery\n", 0o600)
	data := filepath.Join(t.TempDir(), "restored")
	o := restoreOpts(dir, dbtest.EmptyConnString(t), data, "")
	o.PassphraseFile = wrong
	if _, err := Restore(context.Background(), o); !errors.Is(err, ErrKey) {
		t.Fatalf("wrong passphrase: %v", err)
	}
	if _, err := os.Stat(data); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("a refused restore created the data dir: %v", err)
	}
	o.PassphraseFile = pass
	if _, err := Restore(context.Background(), o); err != nil {
		t.Fatalf("restore with the passphrase: %v", err)
	}
}

// TestRestoreRefusals: every refusal leaves the target as it was.
func TestRestoreRefusals(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	w := newWorld(t, 1)
	dir := filepath.Join(t.TempDir(), "backup")
	keyOut := filepath.Join(t.TempDir(), "berth.key")

	if _, err := Backup(ctx, Options{Dir: dir, ConnString: w.conn, Data: datadir.At(w.data), Key: w.key}); err == nil ||
		!strings.Contains(err.Error(), "--key-out") {
		t.Fatalf("backup without a key destination: %v", err)
	}
	if _, err := Backup(ctx, Options{Dir: dir, ConnString: w.conn, Data: datadir.At(w.data), Key: w.key, KeyOut: filepath.Join(dir, "k")}); err == nil || !strings.Contains(err.Error(), "outside") {
		t.Fatalf("key file inside the backup: %v", err)
	}
	m := w.backup(t, dir, keyOut)

	empty := func() (string, string) { return dbtest.EmptyConnString(t), filepath.Join(t.TempDir(), "restored") }
	assertEmpty := func(what, data, conn string) {
		t.Helper()
		if err := emptyDir(data); err != nil {
			t.Fatalf("%s: the data dir is no longer empty: %v", what, err)
		}
		if err := emptyDatabase(ctx, conn); err != nil {
			t.Fatalf("%s: the database is no longer empty: %v", what, err)
		}
	}

	// A data dir with something in it.
	conn, data := empty()
	mustWrite(t, filepath.Join(data, "secret.key"), "x", 0o600)
	if _, err := Restore(ctx, restoreOpts(dir, conn, data, keyOut)); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("non-empty data dir: %v", err)
	}
	// A database with a schema in it (the data dir is empty): nothing written to either.
	_, data = empty()
	migrated := dbtest.ConnString(t)
	if _, err := Restore(ctx, restoreOpts(dir, migrated, data, keyOut)); !errors.Is(err, ErrNotEmpty) {
		t.Fatalf("non-empty database: %v", err)
	}
	if err := emptyDir(data); err != nil {
		t.Fatal(err)
	}
	// Another instance's key.
	conn, data = empty()
	other := filepath.Join(t.TempDir(), "other.key")
	mustWrite(t, other, strings.Repeat("ab", 32)+"\n", 0o600)
	if _, err := Restore(ctx, restoreOpts(dir, conn, data, other)); !errors.Is(err, ErrKey) {
		t.Fatalf("another key: %v", err)
	}
	assertEmpty("another key", data, conn)
	// One flipped byte in an artifact blob.
	blob := filepath.Join(dir, "blobs", m.Artifacts[0].SHA256)
	orig, _ := os.ReadFile(blob)
	_ = os.Chmod(blob, 0o600)
	flipped := bytes.Clone(orig)
	flipped[0] ^= 1
	if err := os.WriteFile(blob, flipped, 0o600); err != nil {
		t.Fatal(err)
	}
	conn, data = empty()
	if _, err := Restore(ctx, restoreOpts(dir, conn, data, keyOut)); !errors.Is(err, ErrCorrupt) {
		t.Fatalf("flipped byte: %v", err)
	}
	assertEmpty("flipped byte", data, conn)
	_ = os.WriteFile(blob, orig, 0o600)
	// An edited manifest (a digest swapped for the one of other content).
	mpath := filepath.Join(dir, "manifest.json")
	mdoc, _ := os.ReadFile(mpath)
	edited := bytes.Replace(mdoc, []byte(m.Artifacts[0].SHA256), []byte(m.Artifacts[1].SHA256), 1)
	if err := os.WriteFile(mpath, edited, 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, restoreOpts(dir, conn, data, keyOut)); !errors.Is(err, ErrManifest) {
		t.Fatalf("edited manifest: %v", err)
	}
	assertEmpty("edited manifest", data, conn)
	_ = os.WriteFile(mpath, mdoc, 0o600)
	// A dump from a newer PostgreSQL major version than the target server (the manifest re-signed
	// with the right key, so only the version refuses it).
	newer := m
	newer.Postgres.Major = 99
	if err := newer.sign(w.key); err != nil {
		t.Fatal(err)
	}
	if _, err := writeManifest(dir, newer); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(ctx, restoreOpts(dir, conn, data, keyOut)); !errors.Is(err, ErrVersionMismatch) ||
		!strings.Contains(err.Error(), "PostgreSQL 99") {
		t.Fatalf("dump from a newer major version: %v", err)
	}
	assertEmpty("newer major version", data, conn)
	_ = os.WriteFile(mpath, mdoc, 0o600)
	// Negative control: the repaired backup restores.
	if _, err := Restore(ctx, restoreOpts(dir, conn, data, keyOut)); err != nil {
		t.Fatalf("repaired backup: %v", err)
	}
}

// TestUnpackLayerRefusesEscapes: a layer tar whose entries leave the target (by name, or through
// a symlink it placed) is refused and leaves nothing behind.
func TestUnpackLayerRefusesEscapes(t *testing.T) {
	t.Parallel()
	for name, build := range map[string]func(*tarBuilder){
		"dotdot":   func(b *tarBuilder) { b.file("../evil", "x") },
		"absolute": func(b *tarBuilder) { b.file("/etc/evil", "x") },
		"through symlink": func(b *tarBuilder) {
			b.symlink("out", "/tmp")
			b.file("out/evil", "x")
		},
	} {
		t.Run(name, func(t *testing.T) {
			b := newTarBuilder()
			build(b)
			parent := t.TempDir()
			target := filepath.Join(parent, "layer")
			if err := unpackLayer(context.Background(), b.reader(), target); err == nil {
				t.Fatal("unpacked")
			}
			if entries, _ := os.ReadDir(parent); len(entries) != 0 {
				t.Fatalf("left behind: %v", entries)
			}
		})
	}
}

// TestClientOfAnotherMajorVersionRefused: with no pg_dump of the server's major version, the
// backup refuses with the versions it found and the package to install; the machine's own
// version is found (negative control).
func TestClientOfAnotherMajorVersionRefused(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	_, major, err := serverMajor(ctx, dbtest.ConnString(t))
	if err != nil {
		t.Fatal(err)
	}
	if p, line, err := findClient(ctx, "pg_dump", major); err != nil || !strings.Contains(line, "PostgreSQL) "+strconv.Itoa(major)) {
		t.Fatalf("the server's own major version %d: %s %q %v", major, p, line, err)
	}
	_, _, err = findClient(ctx, "pg_dump", 99)
	if !errors.Is(err, ErrVersionMismatch) || !strings.Contains(err.Error(), "postgresql-client-99") ||
		!strings.Contains(err.Error(), "is "+strconv.Itoa(major)) {
		t.Fatalf("no client of version 99: %v", err)
	}
}
