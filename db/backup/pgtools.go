package backup

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"

	"berth/db/pgembed"
)

// ErrVersionMismatch means no PostgreSQL client program of the server's major version was found
// (or a backup's dump is from a newer major version than the target server).
var ErrVersionMismatch = errors.New("postgresql major versions differ")

// serverMajor asks the server for its version: "15.10" and 15.
func serverMajor(ctx context.Context, conn string) (string, int, error) {
	c, err := pgx.Connect(ctx, conn)
	if err != nil {
		return "", 0, fmt.Errorf("connect: %w", err)
	}
	defer c.Close(context.WithoutCancel(ctx))
	var v, num string
	if err := c.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('server_version_num')`).Scan(&v, &num); err != nil {
		return "", 0, fmt.Errorf("server version: %w", err)
	}
	n, err := strconv.Atoi(num)
	if err != nil {
		return "", 0, fmt.Errorf("server version %q: %w", num, err)
	}
	return v, n / 10000, nil
}

var clientVersion = regexp.MustCompile(`\(PostgreSQL\) (\d+)(\.\d+)*`)

// clientMajor runs `path --version` and returns its version line and major version.
func clientMajor(ctx context.Context, path string) (string, int, error) {
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return "", 0, err
	}
	line := strings.TrimSpace(string(out))
	m := clientVersion.FindStringSubmatch(line)
	if m == nil {
		return "", 0, fmt.Errorf("%s --version: unexpected %q", path, line)
	}
	n, _ := strconv.Atoi(m[1])
	return line, n, nil
}

// findClient returns the path and version line of the PostgreSQL client program name (pg_dump,
// pg_restore) whose major version is major, looking where the embedded cluster looks for its
// server (pgembed.ClientDirs) and then on PATH. None of that version is ErrVersionMismatch with
// the versions that were found.
func findClient(ctx context.Context, name string, major int) (string, string, error) {
	candidates := []string{}
	for _, d := range pgembed.ClientDirs(ctx, strconv.Itoa(major)) {
		candidates = append(candidates, filepath.Join(d, name))
	}
	if p, err := exec.LookPath(name); err == nil {
		candidates = append(candidates, p)
	}
	var found []string
	seen := map[string]bool{}
	for _, p := range candidates {
		if seen[p] {
			continue
		}
		seen[p] = true
		if fi, err := os.Stat(p); err != nil || !fi.Mode().IsRegular() {
			continue
		}
		line, m, err := clientMajor(ctx, p)
		if err != nil {
			continue
		}
		if m == major {
			return p, line, nil
		}
		found = append(found, fmt.Sprintf("%s is %d", p, m))
	}
	if len(found) == 0 {
		return "", "", fmt.Errorf("%w: the server is PostgreSQL %d and no %s was found "+
			"(install the PostgreSQL %d client: apt-get install postgresql-client-%d)", ErrVersionMismatch, major, name, major, major)
	}
	return "", "", fmt.Errorf("%w: the server is PostgreSQL %d but only other %s versions were found (%s); "+
		"install the PostgreSQL %d client (apt-get install postgresql-client-%d)",
		ErrVersionMismatch, major, name, strings.Join(found, ", "), major, major)
}

// clientEnv turns a connection string (URL or keyword/value) into libpq's PG* variables, so no
// password appears on a command line (ps shows argv to every user on the host).
func clientEnv(conn string) ([]string, error) {
	cfg, err := pgconn.ParseConfig(conn)
	if err != nil {
		return nil, fmt.Errorf("parse connection string: %w", err)
	}
	env := []string{"PATH=" + os.Getenv("PATH"), "LC_ALL=C",
		"PGHOST=" + cfg.Host, "PGPORT=" + strconv.Itoa(int(cfg.Port)), "PGUSER=" + cfg.User, "PGDATABASE=" + cfg.Database,
		"PGCONNECT_TIMEOUT=10"}
	if cfg.Password != "" {
		env = append(env, "PGPASSWORD="+cfg.Password)
	}
	if mode := sslMode(conn); mode != "" {
		env = append(env, "PGSSLMODE="+mode)
	}
	return env, nil
}

// sslMode finds the sslmode a connection string asks for ("" when it names none).
func sslMode(conn string) string {
	if u, err := url.Parse(conn); err == nil && (u.Scheme == "postgres" || u.Scheme == "postgresql") {
		return u.Query().Get("sslmode")
	}
	for _, f := range strings.Fields(conn) {
		if v, ok := strings.CutPrefix(f, "sslmode="); ok {
			return strings.Trim(v, "'")
		}
	}
	return ""
}

// runClient runs a client program with the connection in its environment and returns its error
// with the last lines it printed.
func runClient(ctx context.Context, path string, env []string, args ...string) error {
	cmd := exec.CommandContext(ctx, path, args...)
	cmd.Env = env
	out, err := cmd.CombinedOutput()
	if err != nil {
		msg := strings.TrimSpace(string(out))
		if len(msg) > 2000 {
			msg = "…" + msg[len(msg)-2000:]
		}
		return fmt.Errorf("%s: %w: %s", filepath.Base(path), err, msg)
	}
	return nil
}
