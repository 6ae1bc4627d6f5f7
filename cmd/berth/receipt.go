package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"time"

	"berth/db"
	"berth/environment/jail"
	"berth/environment/seal"
	"berth/workspace"
	"berth/workspace/receipt"
	"berth/workspace/receiptcheck"
)

// maxReceiptFile bounds a receipt file read by `berth receipt verify`.
const maxReceiptFile = 1 << 20

// receiptCmd is `berth receipt verify [--offline] FILE` (DESIGN §13, docs/attempts.md): the
// signature first (a bad one is reported as a signature failure and nothing else is trusted),
// then each digest against what still exists: the workspace on this node's disk, the branch (or
// a discarded attempt's rescue ref) in the source repository, the artifact in the store. It says
// what it checked and what it could not; any mismatch is a non-zero exit.
func receiptCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "verify" {
		return fmt.Errorf("unknown command %q: did you mean %q?", "receipt "+first(args), "receipt verify")
	}
	fs := flagSet("receipt verify", stderr)
	c := baseConfig(fs, getenv)
	offline := fs.Bool("offline", false, "check the signature and what is on disk only; do not open the database")
	rest := args[1:]
	if len(rest) == 0 || strings.HasPrefix(rest[len(rest)-1], "-") {
		if err := parseFlags(fs, rest, stderr); err != nil {
			return err
		}
		return errors.New("receipt verify: give one receipt file, after the flags (as GET /api/runs/{id}/receipt serves it)")
	}
	path := rest[len(rest)-1]
	if err := parseFlags(fs, rest[:len(rest)-1], stderr); err != nil {
		return err
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	doc, err := readReceiptFile(path)
	if err != nil {
		return err
	}
	secret, err := existingSecretKey(getenv("BERTH_SECRET_KEY"), c.DataDir)
	if err != nil {
		return err
	}
	key := receipt.DeriveKey(secret)
	rc, err := receipt.Verify(key, doc)
	if err != nil {
		fmt.Fprintf(stdout, "signature  FAILED  %v\n", err)
		return errors.New("receipt verify: signature failure: the receipt was changed, or was not signed by this instance's key")
	}
	fmt.Fprintf(stdout, "signature  ok      run %s (%s, %s)\n", rc.RunID, rc.Status, rc.Disposition)

	var opts workspace.Options
	if h, err := jail.Detect(ctx); err == nil {
		opts.Jail = &h // git reads a worktree's files in the jail (workspace/gitjail.go)
	}
	mgr, err := workspace.NewManager(c.DataDir, opts)
	if err != nil {
		return err
	}
	src := receiptcheck.Sources{Manager: mgr}
	if store, err := workspace.NewArtifacts(c.DataDir); err == nil {
		src.Artifacts = store
	}
	if *offline {
		src.SkipLineage = "--offline: the database was not opened"
	} else {
		log := c.newLogger(stderr, max(c.LogLevel, slog.LevelWarn))
		dbctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		d, err := openDatabase(dbctx, c, log, false)
		cancel()
		if err != nil {
			src.SkipLineage = "the database could not be opened: " + err.Error()
		} else {
			defer d.close()
			src.Lineage = func(ctx context.Context, runID string) (db.ReceiptLineage, error) {
				return db.LineageOfRun(ctx, d.Pool, runID)
			}
		}
	}
	rep, err := receiptcheck.Verify(ctx, key, doc, src)
	if err != nil {
		return err
	}
	for _, ch := range rep.Checks {
		word := map[string]string{receiptcheck.Match: "ok     ", receiptcheck.Mismatch: "MISMATCH", receiptcheck.Skipped: "skipped"}[ch.Result]
		fmt.Fprintf(stdout, "%-10s %s %s\n", ch.What, word, ch.Detail)
	}
	fmt.Fprintf(stdout, "summary    %d matched, %d mismatched, %d not checked\n", rep.Matched, rep.Mismatched, rep.NotChecked)
	if rep.Mismatched > 0 {
		return fmt.Errorf("receipt verify: %d digest mismatch(es)", rep.Mismatched)
	}
	return nil
}

// readReceiptFile reads a receipt file of at most 1 MiB.
func readReceiptFile(path string) ([]byte, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("receipt verify: %w", err)
	}
	defer f.Close()
	doc, err := io.ReadAll(io.LimitReader(f, maxReceiptFile+1))
	if err != nil {
		return nil, fmt.Errorf("receipt verify: %w", err)
	}
	if len(doc) > maxReceiptFile {
		return nil, errors.New("receipt verify: the file is larger than a receipt can be (1 MiB)")
	}
	return doc, nil
}

// existingSecretKey is the instance's secret key from BERTH_SECRET_KEY or the data dir's key
// file; unlike serve it never creates one (a new key would verify nothing).
func existingSecretKey(envValue, dataDir string) ([]byte, error) {
	if strings.TrimSpace(envValue) == "" {
		if _, err := os.Stat(filepath.Join(dataDir, "secret.key")); err != nil {
			return nil, fmt.Errorf("receipt verify: no secret key: set BERTH_SECRET_KEY or BERTH_DATA_DIR to the instance's (%v)", err)
		}
	}
	key, err := seal.LoadKey(envValue, dataDir)
	if err != nil {
		return nil, fmt.Errorf("receipt verify: %w", err)
	}
	return key, nil
}
