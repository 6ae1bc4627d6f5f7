package pgembed

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// paths names the files of a cluster directory (see the package comment).
type paths struct {
	dir, data, run, log, startLock, owner, users string
}

func newPaths(dir string) paths {
	return paths{
		dir:       dir,
		data:      filepath.Join(dir, "data"),
		run:       filepath.Join(dir, "run"),
		log:       filepath.Join(dir, "postgres.log"),
		startLock: filepath.Join(dir, "start.lock"),
		owner:     filepath.Join(dir, "owner"),
		users:     filepath.Join(dir, "users.lock"),
	}
}

func (p paths) socket() string { return filepath.Join(p.run, fmt.Sprintf(".s.PGSQL.%d", port)) }

// dataVersion returns the major version of the cluster in data, "" if there is none.
func (p paths) dataVersion() string {
	b, err := os.ReadFile(filepath.Join(p.data, "PG_VERSION"))
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

// postmasterPid returns the pid recorded in postmaster.pid, 0 if there is none.
func (p paths) postmasterPid() int {
	b, err := os.ReadFile(filepath.Join(p.data, "postmaster.pid"))
	if err != nil {
		return 0
	}
	first, _, _ := strings.Cut(string(b), "\n")
	pid, _ := strconv.Atoi(strings.TrimSpace(first))
	return pid
}

// openLog opens the log for appending and returns its size before this run.
// A log over 16 MiB is first moved to postgres.log.1, replacing the previous one.
func openLog(path string) (*os.File, int64, error) {
	if fi, err := os.Stat(path); err == nil && fi.Size() > 16<<20 {
		if err := os.Rename(path, path+".1"); err != nil {
			return nil, 0, err
		}
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, 0, err
	}
	fi, err := f.Stat()
	if err != nil {
		f.Close()
		return nil, 0, err
	}
	return f, fi.Size(), nil
}

// logTail returns the last lines of the log written after offset, formatted
// to end an error message, or "" if there are none.
func logTail(path string, offset int64) string {
	const maxBytes, maxLines = 4096, 15
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return ""
	}
	from := max(offset, fi.Size()-maxBytes, 0)
	buf := make([]byte, fi.Size()-from)
	n, _ := f.ReadAt(buf, from)
	text := strings.TrimRight(string(buf[:n]), "\n")
	if text == "" {
		return ""
	}
	lines := strings.Split(text, "\n")
	if from > offset && len(lines) > 1 {
		lines = lines[1:] // cut mid-line
	}
	if len(lines) > maxLines {
		lines = lines[len(lines)-maxLines:]
	}
	return fmt.Sprintf("; last lines of %s:\n\t%s", path, strings.Join(lines, "\n\t"))
}

func syncDir(dir string) error {
	f, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer f.Close()
	return f.Sync()
}
