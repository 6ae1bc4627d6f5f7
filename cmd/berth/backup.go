package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/db/backup"
	"berth/db/pgembed"
	"berth/environment/datadir"
	"berth/environment/seal"
)

// backupCmd is `berth backup DIR`: a consistent backup of the instance (running or not) into DIR
// (package db/backup; docs/operations.md). It never migrates: a backup is of the schema as it is.
func backupCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flagSet("backup", stderr)
	c := baseConfig(fs, getenv)
	keyOut := fs.String("key-out", "", "write the secret key to this file (outside DIR, mode 0600)")
	pass := fs.String("passphrase-file", "", "seal the secret key into DIR with the passphrase on this file's first line")
	dir, rest := splitDir(args)
	if err := parseFlags(fs, rest, stderr); err != nil {
		return err
	}
	if dir == "" {
		return errors.New("backup: usage: berth backup DIR (--key-out FILE | --passphrase-file FILE)")
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	log := c.newLogger(stderr, c.LogLevel)
	key, err := existingKey(getenv("BERTH_SECRET_KEY"), c.DataDir)
	if err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	conn, source := c.DatabaseURL, "database_url"
	if conn == "" {
		source = "embedded"
		cl, err := pgembed.Start(ctx, pgembed.Options{Dir: datadir.At(c.DataDir).Postgres(), Logger: log})
		if err != nil {
			return fmt.Errorf("backup: embedded postgres: %w", err)
		}
		defer stopCluster(cl)
		conn = cl.ConnString()
	}
	res, err := backup.Backup(ctx, backup.Options{Dir: dir, ConnString: conn, Source: source, Data: datadir.At(c.DataDir), Key: key,
		KeyOut: *keyOut, PassphraseFile: *pass, BerthVersion: version, Log: log})
	if err != nil {
		return err
	}
	m := res.Manifest
	fmt.Fprintf(stdout, "backup %s written to %s in %.2fs: database %s, %d image layers, %d artifacts, key %s\n",
		res.Name, dir, float64(m.Stats.DurationMS)/1000, byteSize(m.Database.Size), len(m.Images), len(m.Artifacts), m.Key.Mode)
	fmt.Fprintf(stdout, "copied %d blobs (%s), %d already in %s (%s)\n", m.Stats.CopiedBlobs, byteSize(m.Stats.CopiedBytes),
		m.Stats.ReusedBlobs, dir, byteSize(m.Stats.ReusedBytes))
	fmt.Fprintf(stdout, "%d runs were live (a restore ends them orphaned); %d open workspaces are not in the backup\n",
		len(m.LiveRuns), len(m.OpenWorkspaces))
	return nil
}

// restoreCmd is `berth restore DIR`: the backup back into an empty data dir (and an empty
// DATABASE_URL database). The next `berth serve` migrates forward if this binary is newer.
func restoreCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flagSet("restore", stderr)
	c := baseConfig(fs, getenv)
	keyFile := fs.String("key-file", "", "the key file `berth backup --key-out` wrote")
	pass := fs.String("passphrase-file", "", "the passphrase the key was sealed with (first line)")
	manifest := fs.String("manifest", "", "restore this backup of DIR/manifests (default: the latest)")
	dir, rest := splitDir(args)
	if err := parseFlags(fs, rest, stderr); err != nil {
		return err
	}
	if dir == "" {
		return errors.New("restore: usage: berth restore DIR (--key-file FILE | --passphrase-file FILE)")
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	log := c.newLogger(stderr, c.LogLevel)
	var envKey []byte
	if v := getenv("BERTH_SECRET_KEY"); strings.TrimSpace(v) != "" {
		k, err := seal.LoadKey(v, c.DataDir)
		if err != nil {
			return fmt.Errorf("restore: %w", err)
		}
		envKey = k
	}
	open := func(ctx context.Context) (string, func(), error) {
		if c.DatabaseURL != "" {
			return c.DatabaseURL, func() {}, nil
		}
		cl, err := pgembed.Start(ctx, pgembed.Options{Dir: datadir.At(c.DataDir).Postgres(), Logger: log})
		if err != nil {
			return "", nil, err
		}
		return cl.ConnString(), func() { stopCluster(cl) }, nil
	}
	res, err := backup.Restore(ctx, backup.RestoreOptions{Dir: dir, Manifest: *manifest, Data: datadir.At(c.DataDir),
		KeyFile: *keyFile, PassphraseFile: *pass, EnvKey: envKey, OpenDatabase: open, Log: log,
	})
	if err != nil {
		return err
	}
	m, s := res.Manifest, res.Settled
	fmt.Fprintf(stdout, "restored the backup of %s into %s: %d image layers, %d artifacts\n",
		m.CreatedAt.Format(time.RFC3339), c.DataDir, len(m.Images), len(m.Artifacts))
	fmt.Fprintf(stdout, "settled: %d runs orphaned, %d leases released, %d workspaces closed (reopen rebuilds them), "+
		"%d services stopped, %d setup sessions failed, %d jobs cancelled\n",
		s.Runs, s.Leases, s.Workspaces, s.Services, s.SetupSessions, s.Jobs)
	return nil
}

// splitDir takes the first argument that is not a flag as DIR (flags may come before or after it).
func splitDir(args []string) (string, []string) {
	for i, a := range args {
		if !strings.HasPrefix(a, "-") && (i == 0 || !needsValue(args[i-1])) {
			return a, append(append([]string{}, args[:i]...), args[i+1:]...)
		}
	}
	return "", args
}

// needsValue reports whether a flag argument takes the next argument as its value.
func needsValue(flag string) bool {
	return !strings.Contains(flag, "=") && strings.HasPrefix(flag, "-")
}

// existingKey is the instance's key from BERTH_SECRET_KEY or the data dir; never a new one.
func existingKey(envValue, dataDir string) ([]byte, error) {
	if strings.TrimSpace(envValue) == "" {
		if _, err := os.Stat(filepath.Join(dataDir, "secret.key")); err != nil {
			return nil, fmt.Errorf("no secret key: set BERTH_SECRET_KEY or BERTH_DATA_DIR to the instance's (%v)", err)
		}
	}
	return seal.LoadKey(envValue, dataDir)
}

func stopCluster(cl *pgembed.Cluster) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	_ = cl.Stop(ctx)
}

// byteSize formats n bytes for people.
func byteSize(n int64) string {
	switch {
	case n >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(n)/(1<<30))
	case n >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(n)/(1<<20))
	case n >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(n)/(1<<10))
	}
	return fmt.Sprintf("%d B", n)
}
