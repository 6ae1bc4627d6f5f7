package main

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"berth/db"
	"berth/db/pgembed"
	"berth/environment"
	"berth/environment/datadir"
	"berth/environment/jail/jailtest"
	"berth/jobs"
	"berth/workspace"
	"berth/workspace/receipt"
)

// TestRestoreDrill is the restore drill of docs/operations.md on the embedded default: a real
// `berth serve` with work in it (a project on a git repository, tasks, a finished run with its
// branch and signed receipt, an image version with its layer) is backed up while another run is
// live; the data dir is wiped; `berth restore` brings it back into the empty data dir; a new
// server then shows every object, every receipt verifies under the restored key, the image
// layer's digest matches its version, the live run came back failed/orphaned with the reason and
// no active lease, and a new run works.
func TestRestoreDrill(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	dataDir := jailtest.Dir(t)
	addr := freeAddr(t)
	vars := map[string]string{"BERTH_DATA_DIR": dataDir, "BERTH_ADDR": addr, "BERTH_LOG_LEVEL": "warn",
		"BERTH_ADMIN_EMAIL": "admin@example.com", "BERTH_ADMIN_PASSWORD": "a long admin password"}
	server := func() func() {
		cmd := berthProc(t, vars, "", "serve")
		out := &syncBuffer{}
		cmd.Stdout, cmd.Stderr = out, out
		if err := cmd.Start(); err != nil {
			t.Fatal(err)
		}
		done := make(chan struct{})
		go func() { _ = cmd.Wait(); close(done) }()
		stop := func() {
			_ = cmd.Process.Signal(syscall.SIGTERM)
			select {
			case <-done:
			case <-time.After(time.Minute):
				_ = cmd.Process.Kill()
				<-done
			}
			if t.Failed() {
				t.Logf("server output:\n%s", out.String())
			}
		}
		t.Cleanup(stop)
		waitHealthy(t, "http://"+addr, 2*time.Minute)
		return stop
	}
	// borrow connects the test to the server's embedded cluster, as `berth token add` does.
	borrow := func() (string, func()) {
		cl, err := pgembed.Start(ctx, pgembed.Options{Dir: filepath.Join(dataDir, "pg")})
		if err != nil {
			t.Fatal(err)
		}
		return cl.ConnString(), func() { stopCluster(cl) }
	}

	stopA := server()
	conn, release := borrow()
	w := crashWorldOn(t, conn, dataDir, "")
	_, done := w.admit(`echo one > one.txt`)
	w.waitFor("the first run to finish with a receipt", 2*time.Minute, func() bool {
		_, err := db.ReceiptOf(ctx, w.pool, w.company, done)
		return err == nil
	})
	// An image version of a sandbox environment, its layer where the sandbox driver reads it.
	doc, err := environment.Config{Driver: "sandbox"}.Document()
	if err != nil {
		t.Fatal(err)
	}
	box, err := db.CreateEnvironment(ctx, w.pool, db.NewEnvironment{ID: "6f0d3a52-7a0f-4e47-9d43-0000000b0c5e", CompanyID: w.company, Name: "box", Driver: "sandbox", Config: doc})
	if err != nil {
		t.Fatal(err)
	}
	staged := filepath.Join(dataDir, "staged-layer")
	if err := os.MkdirAll(filepath.Join(staged, "etc"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(staged, "etc", "motd"), []byte("restored layer\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	digest, err := workspace.TreeDigest(ctx, staged)
	if err != nil {
		t.Fatal(err)
	}
	v, err := db.CreateImageVersion(ctx, w.pool, db.NewImageVersion{CompanyID: w.company, EnvironmentID: box.ID, Digest: digest,
		Size: 15, Status: db.ImageAvailable})
	if err != nil {
		t.Fatal(err)
	}
	layer := datadir.At(dataDir).ImageLayer(box.ID, v.Number)
	_ = os.MkdirAll(filepath.Dir(layer), 0o755)
	if err := os.Rename(staged, layer); err != nil {
		t.Fatal(err)
	}
	_, live := w.admit(`sleep 300`)
	w.waitFor("the second run to be running", 2*time.Minute, func() bool { return w.run(live).Status == db.RunRunning })

	before := snapshotObjects(t, w)
	backupDir := filepath.Join(t.TempDir(), "backup")
	keyFile := filepath.Join(t.TempDir(), "berth.key")
	out, stderr, err := runCLI(t, vars, "", "backup", backupDir, "--key-out", keyFile)
	if err != nil {
		t.Fatalf("backup: %v\n%s", err, stderr)
	}
	if !strings.Contains(out, "1 runs were live") {
		t.Fatalf("backup output: %q", out)
	}

	// Disaster: the server goes, and so does the whole data dir.
	w.pool.Close()
	release()
	stopA()
	entries, _ := os.ReadDir(dataDir)
	for _, e := range entries {
		if err := os.RemoveAll(filepath.Join(dataDir, e.Name())); err != nil {
			t.Fatal(err)
		}
	}
	// Restore refuses without the key, and into a data dir that is not empty.
	if _, _, err := runCLI(t, vars, "", "restore", backupDir); err == nil || !strings.Contains(err.Error(), "--key-file") {
		t.Fatalf("restore without the key: %v", err)
	}
	if out, stderr, err := runCLI(t, vars, "", "restore", backupDir, "--key-file", keyFile); err != nil {
		t.Fatalf("restore: %v\n%s", err, stderr)
	} else if !strings.Contains(out, "1 runs orphaned") {
		t.Fatalf("restore output: %q", out)
	}
	if _, _, err := runCLI(t, vars, "", "restore", backupDir, "--key-file", keyFile); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("second restore into the restored data dir: %v", err)
	}

	server()
	conn, release = borrow()
	defer release()
	pool, err := db.Open(ctx, conn)
	if err != nil {
		t.Fatal(err)
	}
	defer pool.Close()
	w.pool = pool
	w.ins, err = jobs.NewClient(jobs.Deps{Pool: pool, Log: slog.New(slog.DiscardHandler)}, jobs.ClientOptions{Work: false})
	if err != nil {
		t.Fatal(err)
	}
	after := snapshotObjects(t, w)
	for name, b := range before {
		if name == "runs" {
			continue // the live run changed: checked below
		}
		if a := after[name]; a != b {
			t.Errorf("%s after the restore:\n%s\nbefore:\n%s", name, a, b)
		}
	}
	key, err := existingKey("", dataDir)
	if err != nil {
		t.Fatal(err)
	}
	rows, err := pool.Query(ctx, `SELECT document FROM receipts`)
	if err != nil {
		t.Fatal(err)
	}
	n := 0
	for rows.Next() {
		var doc []byte
		if err := rows.Scan(&doc); err != nil {
			t.Fatal(err)
		}
		if _, err := receipt.Verify(receipt.DeriveKey(key), doc); err != nil {
			t.Errorf("receipt after restore: %v", err)
		}
		n++
	}
	if rows.Err() != nil || n == 0 {
		t.Fatalf("%d receipts verified (%v)", n, rows.Err())
	}
	if got, err := workspace.TreeDigest(ctx, datadir.At(dataDir).ImageLayer(box.ID, v.Number)); err != nil || got != digest {
		t.Fatalf("restored layer digest %s (%v), version says %s", got, err, digest)
	}
	r := w.run(live)
	if r.Status != db.RunFailed || r.ErrorCode != "orphaned" || !strings.Contains(r.ErrorMessage, "Restored from the backup") {
		t.Fatalf("the live run after the restore: %s/%s %q", r.Status, r.ErrorCode, r.ErrorMessage)
	}
	if c := w.count(`SELECT count(*) FROM environment_leases WHERE status IN ('acquiring', 'active', 'releasing')`); c != 0 {
		t.Fatalf("%d leases still held after the restore", c)
	}
	if c := w.count(`SELECT count(*) FROM runs WHERE status IN ('queued', 'preparing', 'running')`); c != 0 {
		t.Fatalf("%d runs still live after the restore", c)
	}
	if done := w.run(done); done.Status != db.RunSucceeded {
		t.Fatalf("the finished run after the restore: %s", done.Status)
	}
	// New work runs on the restored instance, on the same repository and its branches.
	_, next := w.admit(`echo three > three.txt`)
	w.waitFor("a new run to finish with a receipt", 2*time.Minute, func() bool {
		_, err := db.ReceiptOf(ctx, pool, w.company, next)
		return err == nil
	})
	if r := w.run(next); r.Status != db.RunSucceeded {
		t.Fatalf("new run after the restore: %s/%s %s", r.Status, r.ErrorCode, r.ErrorMessage)
	}
}

// snapshotObjects renders the drill's objects as text, one table per key, for comparison.
func snapshotObjects(t *testing.T, w *crashWorld) map[string]string {
	t.Helper()
	ctx := context.Background()
	queries := map[string]string{
		"companies":      `SELECT id, name, slug FROM companies ORDER BY id`,
		"users":          `SELECT id, email, password_hash FROM users ORDER BY id`,
		"projects":       `SELECT id, name, key, execution_policy::text FROM projects ORDER BY id`,
		"tasks":          `SELECT id, key, title, command, status FROM tasks ORDER BY id`,
		"runs":           `SELECT id, status, error_code, exit_code, log FROM runs ORDER BY id`,
		"receipts":       `SELECT run_id, document, disposition FROM receipts ORDER BY run_id`,
		"work_products":  `SELECT id, kind, ref, url, path FROM work_products ORDER BY id`,
		"image_versions": `SELECT id, number, digest, size, status FROM image_versions ORDER BY id`,
		"environments":   `SELECT id, name, driver, config::text FROM environments ORDER BY id`,
	}
	out := map[string]string{}
	for name, q := range queries {
		rows, err := w.pool.Query(ctx, q)
		if err != nil {
			t.Fatalf("%s: %v", name, err)
		}
		var b bytes.Buffer
		for rows.Next() {
			vals, err := rows.Values()
			if err != nil {
				t.Fatal(err)
			}
			for _, v := range vals {
				b.WriteString(strings.ReplaceAll(strings.TrimSpace(strings.ReplaceAll(fmtValue(v), "\n", " ")), "\t", " "))
				b.WriteByte('|')
			}
			b.WriteByte('\n')
		}
		if rows.Err() != nil {
			t.Fatal(rows.Err())
		}
		out[name] = b.String()
	}
	return out
}

func fmtValue(v any) string {
	switch x := v.(type) {
	case []byte:
		return string(x)
	case [16]byte:
		return string(x[:])
	case nil:
		return "null"
	}
	return strings.TrimSpace(strings.ReplaceAll(fmtAny(v), "\x00", ""))
}

func fmtAny(v any) string { return fmt.Sprint(v) }
