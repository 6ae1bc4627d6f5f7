package pgembed

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// debianRoot is where Debian and Ubuntu install one directory per PostgreSQL major version.
const debianRoot = "/usr/lib/postgresql"

// binaries is a directory holding the PostgreSQL server programs.
type binaries string

func (b binaries) path(name string) string { return filepath.Join(string(b), name) }

// findBinaries returns binDir if it holds initdb and postgres, or, for an empty
// binDir, the first such directory of: the version that created an existing
// cluster (dataVersion, so that installing a newer PostgreSQL next to it does
// not break it), `pg_config --bindir`, the newest /usr/lib/postgresql/*/bin.
func findBinaries(ctx context.Context, binDir, dataVersion string) (binaries, error) {
	if binDir != "" {
		// Absolute, because the programs run with the cluster directory as working directory.
		abs, err := filepath.Abs(binDir)
		if err != nil {
			return "", err
		}
		if !hasServer(abs) {
			return "", fmt.Errorf("%w (looked in %s)", ErrNoBinaries, abs)
		}
		return binaries(abs), nil
	}
	var candidates []string
	if dataVersion != "" {
		candidates = append(candidates, filepath.Join(debianRoot, dataVersion, "bin"))
	}
	// pg_config also comes with the client development files alone, hence hasServer below.
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		candidates = append(candidates, strings.TrimSpace(string(out)))
	}
	candidates = append(candidates, debianBinDirs()...)
	for _, dir := range candidates {
		if filepath.IsAbs(dir) && hasServer(dir) {
			return binaries(dir), nil
		}
	}
	return "", fmt.Errorf("%w (looked at `pg_config --bindir` and %s/*/bin)", ErrNoBinaries, debianRoot)
}

// hasServer reports whether dir holds executable initdb and postgres programs.
func hasServer(dir string) bool {
	for _, name := range []string{"initdb", "postgres"} {
		fi, err := os.Stat(filepath.Join(dir, name))
		if err != nil || !fi.Mode().IsRegular() || fi.Mode().Perm()&0o111 == 0 {
			return false
		}
	}
	return true
}

// debianBinDirs lists /usr/lib/postgresql/<version>/bin, newest version first.
func debianBinDirs() []string {
	type dir struct {
		path    string
		version float64
	}
	matches, _ := filepath.Glob(filepath.Join(debianRoot, "*", "bin"))
	var dirs []dir
	for _, m := range matches {
		// Versions are "15" or, before PostgreSQL 10, "9.6".
		if v, err := strconv.ParseFloat(filepath.Base(filepath.Dir(m)), 64); err == nil {
			dirs = append(dirs, dir{m, v})
		}
	}
	sort.Slice(dirs, func(i, j int) bool { return dirs[i].version > dirs[j].version })
	paths := make([]string, len(dirs))
	for i, d := range dirs {
		paths[i] = d.path
	}
	return paths
}

// ClientDirs lists the directories where PostgreSQL client programs (pg_dump, pg_restore) may
// be, in the order the embedded cluster looks for its server: /usr/lib/postgresql/<major>/bin
// for the wanted major version first (when major is not ""), then `pg_config --bindir`, then
// every /usr/lib/postgresql/*/bin, newest first. Callers check each program's own version:
// Berth's backups use the client of the server's major version only.
func ClientDirs(ctx context.Context, major string) []string {
	var dirs []string
	if major != "" {
		dirs = append(dirs, filepath.Join(debianRoot, major, "bin"))
	}
	if out, err := exec.CommandContext(ctx, "pg_config", "--bindir").Output(); err == nil {
		if d := strings.TrimSpace(string(out)); filepath.IsAbs(d) {
			dirs = append(dirs, d)
		}
	}
	dirs = append(dirs, debianBinDirs()...)
	seen := map[string]bool{}
	out := dirs[:0]
	for _, d := range dirs {
		if !seen[d] {
			seen[d] = true
			out = append(out, d)
		}
	}
	return out
}

// FindServer is the PostgreSQL bin directory Start would use for a new cluster (binDir when
// given): what `berth doctor` reports. It answers ErrNoBinaries when there is none.
func FindServer(ctx context.Context, binDir string) (string, error) {
	b, err := findBinaries(ctx, binDir, "")
	return string(b), err
}
