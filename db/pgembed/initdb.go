package pgembed

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"syscall"
	"time"
)

// initData runs initdb unless the data directory already holds a cluster. It
// initializes into a temporary directory and renames it, so an interrupted
// initdb never leaves a half-made cluster behind. The caller holds start.lock.
func initData(ctx context.Context, p paths, bin binaries, fast bool, log *slog.Logger) error {
	if p.dataVersion() != "" {
		return nil
	}
	entries, err := os.ReadDir(p.data)
	switch {
	case errors.Is(err, fs.ErrNotExist):
	case err != nil:
		return err
	case len(entries) > 0:
		return fmt.Errorf("%s is not empty but holds no PostgreSQL cluster (no PG_VERSION); move it away", p.data)
	default:
		if err := os.Remove(p.data); err != nil {
			return err
		}
	}
	tmp := p.data + ".initdb"
	if err := os.RemoveAll(tmp); err != nil { // left over from an interrupted initdb
		return err
	}
	logFile, offset, err := openLog(p.log)
	if err != nil {
		return err
	}
	defer logFile.Close()
	args := []string{"-D", tmp, "-U", superuser, "--auth=trust", "-E", "UTF8", "--locale=C"}
	if fast {
		args = append(args, "--no-sync")
	}
	began := time.Now()
	initdb, err := spawn(command(bin.path("initdb"), p.dir, logFile, syscall.SIGKILL, args...))
	if err != nil {
		return fmt.Errorf("run initdb: %w", err)
	}
	select {
	case <-initdb.done:
	case <-ctx.Done():
		// The whole group: initdb runs postgres in bootstrap mode as its child.
		_ = syscall.Kill(-initdb.cmd.Process.Pid, syscall.SIGKILL)
		<-initdb.done
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("initdb: %w", ctx.Err())
	}
	if initdb.err != nil {
		_ = os.RemoveAll(tmp)
		return fmt.Errorf("initdb: %s%s", initdb.exitStatus(), logTail(p.log, offset))
	}
	if err := os.Rename(tmp, p.data); err != nil {
		return err
	}
	if !fast {
		if err := syncDir(p.dir); err != nil {
			return err
		}
	}
	log.Info("initialized embedded PostgreSQL cluster", "dir", p.data, "took", time.Since(began))
	return nil
}
