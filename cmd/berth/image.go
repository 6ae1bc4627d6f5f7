package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"berth/db"
	"berth/environment/datadir"
	"berth/jobs"
)

// imageCmd is `berth image import ENV SOURCE [--activate]`: an OCI image (layout dir or tar,
// docker save tarball, registry reference) becomes the environment's next image version.
func imageCmd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	if len(args) == 0 || args[0] != "import" {
		return errors.New("usage: berth image import [--activate] ENV SOURCE")
	}
	fs := flagSet("image import", stderr)
	c := baseConfig(fs, getenv)
	activate := fs.Bool("activate", false, "make the new version the active one (default: keep it available)")
	if err := fs.Parse(args[1:]); err != nil {
		return fmt.Errorf("image import: %w", err)
	}
	if fs.NArg() != 2 {
		return errors.New("usage: berth image import [--activate] ENV SOURCE (ENV: the environment's id or COMPANY-SLUG/NAME)")
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	log := c.newLogger(stderr, max(c.LogLevel, slog.LevelWarn))
	d, err := openDatabase(ctx, c, log, false)
	if err != nil {
		return err
	}
	defer d.close()
	company, id, err := db.EnvironmentCompany(ctx, d.Pool, fs.Arg(0))
	if errors.Is(err, db.ErrNotFound) {
		return fmt.Errorf("image import: no environment %q", fs.Arg(0))
	}
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "importing %s …\n", fs.Arg(1))
	out, err := jobs.ImportImage(ctx, jobs.Deps{Pool: d.Pool, Log: log, Data: datadir.At(c.DataDir)}, jobs.ImportImageRequest{
		CompanyID: company, EnvironmentID: id, Source: fs.Arg(1), Activate: *activate, ActorLabel: "berth image import"})
	if err != nil {
		return err
	}
	fmt.Fprintf(stdout, "version %d %s %s (%d bytes, from %s %s)\n", out.Version.Number, out.Version.Status, out.Version.Digest,
		out.Version.Size, out.Kind, out.Source)
	if len(out.Skipped) > 0 {
		fmt.Fprintf(stderr, "skipped %d entries that are neither files, directories nor links (FIFOs, sockets)\n", len(out.Skipped))
	}
	return nil
}
