package backup

import (
	"berth/environment/datadir"

	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// RestoreOptions configures Restore.
type RestoreOptions struct {
	Dir      string         // the backup directory
	Manifest string         // a name under DIR/manifests; "" restores the latest backup
	Data     datadir.Layout // the target data dir: absent or empty
	// KeyFile (a --key-out file) or PassphraseFile (for DIR/secret.key.sealed); or EnvKey, the
	// key BERTH_SECRET_KEY already gives the target instance (then no key file is written).
	KeyFile, PassphraseFile string
	EnvKey                  []byte
	// OpenDatabase makes the target database reachable once the data dir has been checked and
	// created (the embedded cluster starts inside it); it returns the connection string and a
	// function that releases it.
	OpenDatabase func(ctx context.Context) (string, func(), error)
	Log          *slog.Logger
}

// Restored is what a restore did.
type Restored struct {
	Manifest Manifest
	Settled  Settled
}

// ErrNotEmpty means the restore target already holds an instance (files in the data dir, or tables
// in the database); restore never merges into one.
var ErrNotEmpty = errors.New("restore target is not empty")

// Restore brings a backup back into an empty data dir and database. Before anything is written it
// checks the key against the manifest, the manifest's MAC, and every blob's sha256 and size; then
// it restores the dump in one transaction, settles what was live (settle), checks the row counts,
// and unpacks artifacts and layers. When it fails after the data dir was created it removes what
// it wrote, so the target is empty again.
func Restore(ctx context.Context, o RestoreOptions) (Restored, error) {
	if err := emptyDir(o.Data.Root); err != nil {
		return Restored{}, err
	}
	m, err := readManifest(o.Dir, o.Manifest)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	key, err := restoreKey(o, m)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	if err := m.checkMAC(key); err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	bl := blobs{dir: filepath.Join(o.Dir, "blobs")}
	all := []Blob{m.Database}
	for _, l := range m.Images {
		all = append(all, l.Blob)
	}
	all = append(all, m.Artifacts...)
	for _, b := range all {
		if err := bl.verify(b.SHA256, b.Size); err != nil {
			return Restored{}, fmt.Errorf("restore: %w", err)
		}
	}

	created := false
	if _, err := os.Stat(o.Data.Root); errors.Is(err, os.ErrNotExist) {
		created = true
	}
	if err := os.MkdirAll(o.Data.Root, 0o700); err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	out, err := restoreInto(ctx, o, m, key, bl)
	if err != nil {
		clearDir(o.Data.Root, created)
		return Restored{}, err
	}
	return out, nil
}

func restoreInto(ctx context.Context, o RestoreOptions, m Manifest, key []byte, bl blobs) (Restored, error) {
	if o.EnvKey == nil {
		if err := writeFileAtomic(o.Data.SecretKey(), []byte(fmt.Sprintf("%x\n", key)), 0o600); err != nil {
			return Restored{}, fmt.Errorf("restore: secret key: %w", err)
		}
	}
	conn, release, err := o.OpenDatabase(ctx)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: database: %w", err)
	}
	defer release()
	if err := emptyDatabase(ctx, conn); err != nil {
		return Restored{}, err
	}
	_, major, err := serverMajor(ctx, conn)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	if m.Postgres.Major > major {
		return Restored{}, fmt.Errorf("restore: %w: the backup's database is PostgreSQL %d, the target server is %d "+
			"(restore into PostgreSQL %d or newer)", ErrVersionMismatch, m.Postgres.Major, major, m.Postgres.Major)
	}
	pgRestore, _, err := findClient(ctx, "pg_restore", major)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	env, err := clientEnv(conn)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	cfg, _ := pgconn.ParseConfig(conn)
	if err := runClient(ctx, pgRestore, env, "--no-password", "--no-owner", "--no-privileges", "--exit-on-error",
		"--single-transaction", "--dbname="+cfg.Database, bl.path(m.Database.SHA256)); err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	out := Restored{Manifest: m}
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	err = pgx.BeginFunc(ctx, c, func(tx pgx.Tx) error {
		for _, t := range rowTables {
			var n int64
			if err := tx.QueryRow(ctx, `SELECT count(*) FROM `+pgx.Identifier{t}.Sanitize()).Scan(&n); err != nil {
				return err
			}
			if want, ok := m.Rows[t]; ok && n != want {
				return fmt.Errorf("%s has %d rows after the restore, the backup counted %d", t, n, want)
			}
		}
		var err error
		out.Settled, err = settle(ctx, tx, m.CreatedAt)
		return err
	})
	if err != nil {
		return Restored{}, fmt.Errorf("restore: %w", err)
	}
	if err := restoreArtifacts(o, m, bl); err != nil {
		return Restored{}, fmt.Errorf("restore: artifacts: %w", err)
	}
	for _, l := range m.Images {
		if err := restoreLayer(ctx, o, l, bl); err != nil {
			return Restored{}, fmt.Errorf("restore: image version %d: %w", l.Number, err)
		}
	}
	return out, nil
}

func restoreLayer(ctx context.Context, o RestoreOptions, l ImageLayer, bl blobs) error {
	f, err := os.Open(bl.path(l.SHA256))
	if err != nil {
		return err
	}
	defer f.Close()
	return unpackLayer(ctx, f, o.Data.ImageLayer(l.EnvironmentID, l.Number))
}

func restoreArtifacts(o RestoreOptions, m Manifest, bl blobs) error {
	dir := o.Data.Artifacts()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	store := blobs{dir: dir}
	for _, a := range m.Artifacts {
		if _, err := store.copyFile(bl.path(a.SHA256), a.SHA256, a.Size); err != nil {
			return err
		}
		if err := os.Chmod(store.path(a.SHA256), 0o444); err != nil { // as Artifacts.Put leaves them
			return err
		}
	}
	return nil
}

// restoreKey finds the key the operator gave and checks it is the backed-up instance's.
func restoreKey(o RestoreOptions, m Manifest) ([]byte, error) {
	var key []byte
	var err error
	switch {
	case o.KeyFile != "" && o.PassphraseFile != "":
		return nil, errors.New("give --key-file or --passphrase-file, not both")
	case o.KeyFile != "":
		key, err = readKeyFile(o.KeyFile)
	case o.PassphraseFile != "":
		pass, perr := readPassphrase(o.PassphraseFile)
		if perr != nil {
			return nil, perr
		}
		doc, rerr := os.ReadFile(filepath.Join(o.Dir, "secret.key.sealed"))
		if rerr != nil {
			return nil, fmt.Errorf("this backup has no sealed key (%v): give --key-file", rerr)
		}
		key, err = openKey(doc, pass)
	case o.EnvKey != nil:
		key = o.EnvKey
	default:
		if m.Key.Mode == "sealed" {
			return nil, errors.New("the backup's key is sealed: give --passphrase-file")
		}
		return nil, errors.New("the backup's key was written to a separate file: give --key-file (or set BERTH_SECRET_KEY)")
	}
	if err != nil {
		return nil, err
	}
	if keyID(key) != m.Key.KeyID {
		return nil, fmt.Errorf("%w (key id %s, the backup's is %s)", ErrKey, keyID(key), m.Key.KeyID)
	}
	return key, nil
}

// emptyDir accepts a missing or empty directory.
func emptyDir(dir string) error {
	f, err := os.Open(dir)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restore: data dir: %w", err)
	}
	defer f.Close()
	names, err := f.Readdirnames(1)
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("restore: data dir: %w", err)
	}
	if len(names) > 0 {
		return fmt.Errorf("%w: the data dir %s holds files (%s…); restore only into an empty one", ErrNotEmpty, dir, names[0])
	}
	return nil
}

// emptyDatabase refuses a database that holds any table, view or sequence outside the system schemas.
func emptyDatabase(ctx context.Context, conn string) error {
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var n int
	err = c.QueryRow(ctx, `SELECT count(*) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
		WHERE n.nspname NOT IN ('pg_catalog', 'information_schema', 'pg_toast') AND n.nspname NOT LIKE 'pg_temp%'
		AND c.relkind IN ('r', 'p', 'v', 'm', 'S', 'f')`).Scan(&n)
	if err != nil {
		return fmt.Errorf("restore: %w", err)
	}
	if n > 0 {
		return fmt.Errorf("%w: the database holds %d relations; restore only into an empty database", ErrNotEmpty, n)
	}
	return nil
}

// clearDir empties the data dir a failed restore wrote into (removing it if the restore made it).
func clearDir(dir string, created bool) {
	if created {
		_ = os.RemoveAll(dir)
		return
	}
	entries, _ := os.ReadDir(dir)
	for _, e := range entries {
		_ = os.RemoveAll(filepath.Join(dir, e.Name()))
	}
}
