// Package backup makes and restores Berth backups (docs/operations.md): the database as a
// `pg_dump -Fc` taken with the PostgreSQL client of the server's own major version, the image
// layers and artifacts as content-addressed blobs (so a second backup into the same directory
// copies only what is new), the secret key sealed with a passphrase or written to a file of the
// operator's choosing, and a signed manifest. Restore goes into an empty data dir (and an empty
// database), verifies every blob first, and settles what was live at backup time: runs end
// orphaned with the reason, leases are released, workspaces (never in a backup) are closed so
// that reopening rebuilds them from their branches.
//
// It lives beside db because it runs PostgreSQL's own client programs; nothing above cmd/berth
// imports it, so handlers stay free of os/exec.
package backup

import (
	"berth/environment/datadir"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/jackc/pgx/v5"
)

// Options configures Backup.
type Options struct {
	Dir        string         // the backup directory; created (0700) if missing, reused for incremental backups
	ConnString string         // the instance's database
	Source     string         // "embedded" or "database_url", recorded in the manifest
	Data       datadir.Layout // the instance's data dir (artifacts, image layers)
	Key        []byte         // the instance's secret key
	// Exactly one of KeyOut (write the key to this file, outside Dir, mode 0600) and
	// PassphraseFile (seal the key into Dir with the passphrase on this file's first line).
	KeyOut         string
	PassphraseFile string
	BerthVersion   string
	Log            *slog.Logger
}

// Result is what a backup wrote.
type Result struct {
	Manifest Manifest
	Name     string // DIR/manifests/<Name>
}

// rowTables are counted into the manifest and checked after a restore.
var rowTables = []string{"companies", "users", "projects", "tasks", "runs", "receipts", "image_versions",
	"work_products", "execution_workspaces", "environment_leases", "audit_events"}

// Backup makes one consistent backup of a running instance into opts.Dir. The dump and the
// manifest's lists come from one exported snapshot; layers and artifacts are immutable once their
// rows commit, so copying them after the snapshot yields at least what the dump refers to.
func Backup(ctx context.Context, opts Options) (Result, error) {
	began := time.Now()
	if err := checkKeyTarget(opts); err != nil {
		return Result{}, err
	}
	if err := os.MkdirAll(opts.Dir, 0o700); err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	unlock, err := lockDir(opts.Dir)
	if err != nil {
		return Result{}, err
	}
	defer unlock()
	bl, err := openBlobs(opts.Dir)
	if err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	prev, _ := readManifest(opts.Dir, "") // the last backup's layers need not be packed again

	version, major, err := serverMajor(ctx, opts.ConnString)
	if err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	pgDump, client, err := findClient(ctx, "pg_dump", major)
	if err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	env, err := clientEnv(opts.ConnString)
	if err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	m := Manifest{Format: FormatVersion, BerthVersion: opts.BerthVersion, CreatedAt: time.Now().UTC(),
		Postgres: PGInfo{Source: opts.Source, ServerVersion: version, Major: major, Client: client}, Rows: map[string]int64{}}

	conn, err := pgx.Connect(ctx, opts.ConnString)
	if err != nil {
		return Result{}, fmt.Errorf("backup: connect: %w", err)
	}
	defer conn.Close(context.WithoutCancel(ctx))
	tx, err := conn.BeginTx(ctx, pgx.TxOptions{IsoLevel: pgx.RepeatableRead, AccessMode: pgx.ReadOnly})
	if err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	defer tx.Rollback(context.WithoutCancel(ctx))
	var snapshot string
	if err := tx.QueryRow(ctx, `SELECT pg_export_snapshot()`).Scan(&snapshot); err != nil {
		return Result{}, fmt.Errorf("backup: export snapshot: %w", err)
	}
	if err := describe(ctx, tx, &m); err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	var stderr strings.Builder
	sum, size, stored, err := bl.write(func(w io.Writer) error {
		cmd := exec.CommandContext(ctx, pgDump, "--format=custom", "--no-password", "--snapshot="+snapshot)
		cmd.Env, cmd.Stdout, cmd.Stderr = env, w, &stderr
		if err := cmd.Run(); err != nil {
			return fmt.Errorf("pg_dump: %w: %s", err, strings.TrimSpace(stderr.String()))
		}
		return nil
	})
	if err != nil {
		return Result{}, fmt.Errorf("backup: %w", err)
	}
	m.Database = Blob{SHA256: sum, Size: size}
	m.Stats.add(stored, size)
	_ = tx.Rollback(ctx) // the dump is taken: the snapshot may go

	if err := backupLayers(ctx, opts, bl, prev, &m); err != nil {
		return Result{}, fmt.Errorf("backup: image layers: %w", err)
	}
	if err := backupArtifacts(opts, bl, &m); err != nil {
		return Result{}, fmt.Errorf("backup: artifacts: %w", err)
	}
	if err := storeKey(opts, &m); err != nil {
		return Result{}, fmt.Errorf("backup: secret key: %w", err)
	}
	m.Stats.DurationMS = time.Since(began).Milliseconds()
	if err := m.sign(opts.Key); err != nil {
		return Result{}, err
	}
	name, err := writeManifest(opts.Dir, m)
	if err != nil {
		return Result{}, fmt.Errorf("backup: manifest: %w", err)
	}
	return Result{Manifest: m, Name: name}, nil
}

// describe fills the manifest's lists from the snapshot.
func describe(ctx context.Context, tx pgx.Tx, m *Manifest) error {
	if err := tx.QueryRow(ctx, `SELECT coalesce(max(version), 0) FROM berth_migrations`).Scan(&m.SchemaVersion); err != nil {
		return fmt.Errorf("schema version: %w", err)
	}
	for _, t := range rowTables {
		var n int64
		if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{t}.Sanitize()).Scan(&n); err != nil {
			return fmt.Errorf("count %s: %w", t, err)
		}
		m.Rows[t] = n
	}
	rows, err := tx.Query(ctx, `SELECT id::text, company_id::text, project_id::text, status, coalesce(branch, ''), coalesce(base_ref, '')
		FROM execution_workspaces WHERE status <> 'closed' ORDER BY created_at, id`)
	if err != nil {
		return fmt.Errorf("open workspaces: %w", err)
	}
	m.OpenWorkspaces, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (OpenWorkspace, error) {
		var w OpenWorkspace
		return w, r.Scan(&w.ID, &w.CompanyID, &w.ProjectID, &w.Status, &w.Branch, &w.BaseRef)
	})
	if err != nil {
		return fmt.Errorf("open workspaces: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT id::text, coalesce(task_id::text, ''), status FROM runs
		WHERE status IN ('queued', 'preparing', 'running') ORDER BY created_at, id`)
	if err != nil {
		return fmt.Errorf("live runs: %w", err)
	}
	m.LiveRuns, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (LiveRun, error) {
		var l LiveRun
		return l, r.Scan(&l.ID, &l.TaskID, &l.Status)
	})
	if err != nil {
		return fmt.Errorf("live runs: %w", err)
	}
	rows, err = tx.Query(ctx, `SELECT id::text, environment_id::text, number, digest FROM image_versions
		WHERE digest <> '' AND status IN ('available', 'active', 'revoked') ORDER BY environment_id, number`)
	if err != nil {
		return fmt.Errorf("image versions: %w", err)
	}
	m.Images, err = pgx.CollectRows(rows, func(r pgx.CollectableRow) (ImageLayer, error) {
		var l ImageLayer
		return l, r.Scan(&l.VersionID, &l.EnvironmentID, &l.Number, &l.Digest)
	})
	if err != nil {
		return fmt.Errorf("image versions: %w", err)
	}
	return nil
}

// backupLayers packs each version's layer, unless the previous backup in DIR has the same version
// (layers never change once their version exists) and its blob is still there.
func backupLayers(ctx context.Context, opts Options, bl blobs, prev Manifest, m *Manifest) error {
	known := map[string]ImageLayer{}
	for _, l := range prev.Images {
		known[l.VersionID] = l
	}
	kept := m.Images[:0]
	for _, l := range m.Images {
		if p, ok := known[l.VersionID]; ok && p.Digest == l.Digest && p.Number == l.Number && bl.has(p.SHA256, p.Size) {
			l.Blob = p.Blob
			m.Stats.add(false, l.Size)
			kept = append(kept, l)
			continue
		}
		dir := opts.Data.ImageLayer(l.EnvironmentID, l.Number)
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() {
			// A version without its layer on disk cannot be restored either; say so in the log.
			if opts.Log != nil {
				opts.Log.Warn("image version has no layer on disk; not in the backup", "version", l.VersionID, "number", l.Number)
			}
			continue
		}
		sum, size, stored, err := bl.write(func(w io.Writer) error { return packLayer(ctx, dir, w) })
		if err != nil {
			return fmt.Errorf("version %d: %w", l.Number, err)
		}
		l.Blob = Blob{SHA256: sum, Size: size}
		m.Stats.add(stored, size)
		kept = append(kept, l)
	}
	m.Images = kept
	return nil
}

// backupArtifacts copies every artifact of <data dir>/artifacts that DIR does not hold yet.
func backupArtifacts(opts Options, bl blobs, m *Manifest) error {
	dir := opts.Data.Artifacts()
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	for _, e := range entries {
		if !validHex(e.Name()) || !e.Type().IsRegular() {
			continue // a Put's temporary file, or something that is not an artifact
		}
		fi, err := e.Info()
		if err != nil {
			return err
		}
		stored, err := bl.copyFile(filepath.Join(dir, e.Name()), e.Name(), fi.Size())
		if err != nil {
			return err
		}
		m.Stats.add(stored, fi.Size())
		m.Artifacts = append(m.Artifacts, Blob{SHA256: e.Name(), Size: fi.Size()})
	}
	return nil
}

// checkKeyTarget insists on exactly one place for the key, and on a key file outside DIR.
func checkKeyTarget(opts Options) error {
	if len(opts.Key) != 32 {
		return errors.New("backup: no secret key")
	}
	if (opts.KeyOut == "") == (opts.PassphraseFile == "") {
		return errors.New("backup: say where the secret key goes: --key-out FILE (a separate file, kept apart from the backup) " +
			"or --passphrase-file FILE (sealed into the backup with that passphrase)")
	}
	if opts.KeyOut != "" {
		dir, err1 := filepath.Abs(opts.Dir)
		out, err2 := filepath.Abs(opts.KeyOut)
		if err1 != nil || err2 != nil {
			return errors.New("backup: cannot resolve --key-out")
		}
		if rel, err := filepath.Rel(dir, out); err == nil && !strings.HasPrefix(rel, "..") {
			return errors.New("backup: --key-out must be outside the backup directory (whoever has both has every secret)")
		}
	}
	return nil
}

// storeKey writes the key where the operator chose.
func storeKey(opts Options, m *Manifest) error {
	m.Key.KeyID = keyID(opts.Key)
	if opts.PassphraseFile != "" {
		pass, err := readPassphrase(opts.PassphraseFile)
		if err != nil {
			return err
		}
		doc, err := sealKey(opts.Key, pass)
		if err != nil {
			return err
		}
		m.Key.Mode = "sealed"
		return writeFileAtomic(filepath.Join(opts.Dir, "secret.key.sealed"), doc, 0o600)
	}
	m.Key.Mode = "separate"
	if old, err := readKeyFile(opts.KeyOut); err == nil && keyID(old) != m.Key.KeyID {
		return fmt.Errorf("%s holds another key; refusing to overwrite it", opts.KeyOut)
	}
	if err := os.MkdirAll(filepath.Dir(opts.KeyOut), 0o700); err != nil {
		return err
	}
	return writeFileAtomic(opts.KeyOut, []byte(fmt.Sprintf("%x\n", opts.Key)), 0o600)
}

// lockDir takes an exclusive flock on DIR/lock so two backups never write one directory at once.
func lockDir(dir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(dir, "lock"), os.O_RDWR|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB); err != nil {
		f.Close()
		return nil, fmt.Errorf("backup: another backup or restore is using %s", dir)
	}
	return func() { f.Close() }, nil
}
