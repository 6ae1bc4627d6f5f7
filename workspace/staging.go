package workspace

import (
	"errors"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"syscall"
	"time"
)

// Staging directories (capsule imports, image imports) are made next to where their result goes
// and renamed into place when complete; a process killed midway leaves one behind. Their names
// carry the pid of the process that made them, so SweepStaging can tell a dead process's leftover
// from a live import's work in progress (docs/security.md "Fault catalog", F12).

// staleStagingAge: a staging directory this old is removed whatever its pid says (a reused pid
// must not keep a leftover forever).
const staleStagingAge = 24 * time.Hour

// StagingPattern is the os.MkdirTemp pattern of a staging directory for kind (e.g. "import"):
// ".<kind>.staging-<pid>-*".
func StagingPattern(kind string) string {
	return "." + kind + ".staging-" + strconv.Itoa(os.Getpid()) + "-"
}

var stagingName = regexp.MustCompile(`^\..+\.staging-([0-9]+)-[^/]*$`)

// SweepStaging removes the staging directories directly in dir whose process is gone (or that are
// older than a day) and returns how many it removed. A live process's staging directory, this
// process's included, is left alone. A missing dir is not an error.
func SweepStaging(dir string) (int, error) {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, os.ErrNotExist) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	removed := 0
	var errs []error
	for _, e := range entries {
		m := stagingName.FindStringSubmatch(e.Name())
		if m == nil || !e.IsDir() {
			continue
		}
		pid, _ := strconv.Atoi(m[1])
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if processAlive(pid) && time.Since(fi.ModTime()) < staleStagingAge {
			continue
		}
		if err := removeTree(filepath.Join(dir, e.Name())); err != nil {
			errs = append(errs, err)
			continue
		}
		removed++
	}
	return removed, errors.Join(errs...)
}

// processAlive reports whether pid names a running process (this one included).
func processAlive(pid int) bool {
	if pid <= 0 {
		return false
	}
	if pid == os.Getpid() {
		return true
	}
	err := syscall.Kill(pid, 0)
	return err == nil || errors.Is(err, syscall.EPERM)
}
