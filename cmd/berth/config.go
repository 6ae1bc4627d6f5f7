package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// config is everything a berth process is configured with: environment first, flags override.
type config struct {
	Addr          string
	DataDir       string
	BaseURL       *url.URL
	DatabaseURL   string
	Workers       bool
	MaxWorkers    int
	AdminEmail    string
	AdminPassword string
	Demo          bool
	LogLevel      slog.Level
	LogFormat     string // "text" or "json" (BERTH_LOG_FORMAT)
	MetricsToken  string // a bearer token for GET /metrics (BERTH_METRICS_TOKEN); "" for admins only
	// TrustedProxies are the peers allowed to name the client in X-Forwarded-For
	// (BERTH_TRUSTED_PROXIES).
	TrustedProxies []netip.Prefix
	// CopyMaxBytes and CopyMaxFiles bound a copy realization's source (BERTH_COPY_MAX_BYTES,
	// BERTH_COPY_MAX_FILES); zero takes the workspace package's defaults.
	CopyMaxBytes int64
	CopyMaxFiles int
}

// flagSet is a FlagSet that prints its errors as one line and its help on request.
func flagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	_ = stderr
	return fs
}

// parseFlags parses args and turns flag errors into one clear line.
func parseFlags(fs *flag.FlagSet, args []string, stderr io.Writer) error {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.SetOutput(stderr)
			fmt.Fprintf(stderr, "usage of berth %s:\n", fs.Name())
			fs.PrintDefaults()
			return err
		}
		return fmt.Errorf("%s: %w", fs.Name(), err)
	}
	if fs.NArg() > 0 {
		return fmt.Errorf("%s: unexpected argument %q", fs.Name(), fs.Arg(0))
	}
	return nil
}

// baseConfig reads the settings every command shares and registers their flags on fs.
func baseConfig(fs *flag.FlagSet, getenv func(string) string) *config {
	c := &config{}
	fs.StringVar(&c.DataDir, "data-dir", defaultDataDir(getenv, os.Geteuid()), "data directory (BERTH_DATA_DIR)")
	c.DatabaseURL = getenv("DATABASE_URL")
	c.LogLevel = slog.LevelInfo
	if lv := getenv("BERTH_LOG_LEVEL"); lv != "" {
		_ = c.LogLevel.UnmarshalText([]byte(lv))
	}
	c.LogFormat = strings.ToLower(strings.TrimSpace(getenv("BERTH_LOG_FORMAT")))
	c.MetricsToken = getenv("BERTH_METRICS_TOKEN")
	return c
}

// systemDataDir is the data dir of a Berth run by root without BERTH_DATA_DIR: a system service's
// place (FHS /var/lib), not root's home, whose 0700 parents nothing else may traverse.
const systemDataDir = "/var/lib/berth"

// defaultDataDir is BERTH_DATA_DIR; else, for root (euid 0), /var/lib/berth; else
// $XDG_DATA_HOME/berth, else ~/.local/share/berth.
func defaultDataDir(getenv func(string) string, euid int) string {
	if d := getenv("BERTH_DATA_DIR"); d != "" {
		return d
	}
	if euid == 0 {
		return systemDataDir
	}
	if d := getenv("XDG_DATA_HOME"); d != "" {
		return filepath.Join(d, "berth")
	}
	if home := getenv("HOME"); home != "" {
		return filepath.Join(home, ".local", "share", "berth")
	}
	return "berth-data"
}

// finish validates what the flags and environment gave.
func (c *config) finish(getenv func(string) string, baseURL string) error {
	abs, err := filepath.Abs(c.DataDir)
	if err != nil {
		return fmt.Errorf("data dir: %w", err)
	}
	c.DataDir = abs
	if c.Addr != "" {
		if _, _, err := net.SplitHostPort(c.Addr); err != nil {
			return fmt.Errorf("BERTH_ADDR %q: want host:port", c.Addr)
		}
		if baseURL == "" {
			host, port, _ := net.SplitHostPort(c.Addr)
			if host == "" || host == "0.0.0.0" || host == "::" {
				host = "localhost"
			}
			baseURL = "http://" + net.JoinHostPort(host, port)
		}
	}
	if baseURL != "" {
		u, err := url.Parse(baseURL)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || (u.Path != "" && u.Path != "/") {
			return fmt.Errorf("BERTH_BASE_URL %q: want http(s)://host[:port] with no path", baseURL)
		}
		u.Path = ""
		c.BaseURL = u
	}
	c.AdminEmail = getenv("BERTH_ADMIN_EMAIL")
	c.AdminPassword = getenv("BERTH_ADMIN_PASSWORD")
	if c.LogFormat != "" && c.LogFormat != "text" && c.LogFormat != "json" {
		return fmt.Errorf("BERTH_LOG_FORMAT=%q: want text or json", c.LogFormat)
	}
	if c.MetricsToken != "" && len(c.MetricsToken) < minMetricsToken {
		return fmt.Errorf("BERTH_METRICS_TOKEN: use at least %d characters (e.g. openssl rand -hex 32)", minMetricsToken)
	}
	if c.TrustedProxies, err = parseTrustedProxies(getenv("BERTH_TRUSTED_PROXIES")); err != nil {
		return err
	}
	if c.CopyMaxBytes, err = parseSize(getenv("BERTH_COPY_MAX_BYTES")); err != nil {
		return fmt.Errorf("BERTH_COPY_MAX_BYTES: %w", err)
	}
	if v := strings.TrimSpace(getenv("BERTH_COPY_MAX_FILES")); v != "" {
		if c.CopyMaxFiles, err = strconv.Atoi(strings.ReplaceAll(v, "_", "")); err != nil || c.CopyMaxFiles < 1 {
			return fmt.Errorf("BERTH_COPY_MAX_FILES=%q: want a positive number of files", v)
		}
	}
	return nil
}

// parseSize reads a byte count: a whole number, optionally with a binary suffix (K, M, G, T, with or
// without "iB"); "" is zero (the default).
func parseSize(v string) (int64, error) {
	v = strings.ToUpper(strings.TrimSpace(v))
	if v == "" {
		return 0, nil
	}
	shift := 0
	num := strings.TrimSuffix(strings.TrimSuffix(v, "B"), "I")
	if n := len(num); n > 0 {
		if i := strings.IndexByte("KMGT", num[n-1]); i >= 0 {
			shift, num = 10*(i+1), num[:n-1]
		}
	}
	n, err := strconv.ParseInt(strings.TrimSpace(num), 10, 64)
	if err != nil || n < 1 || n > (1<<62)>>shift {
		return 0, fmt.Errorf("%q: want a positive size such as 2GiB or 500M", v)
	}
	return n << shift, nil
}

// parseTrustedProxies reads BERTH_TRUSTED_PROXIES: comma-separated CIDRs (a bare address is a
// single host).
func parseTrustedProxies(v string) ([]netip.Prefix, error) {
	var out []netip.Prefix
	for _, f := range strings.Split(v, ",") {
		f = strings.TrimSpace(f)
		if f == "" {
			continue
		}
		if !strings.Contains(f, "/") {
			a, err := netip.ParseAddr(f)
			if err != nil {
				return nil, fmt.Errorf("BERTH_TRUSTED_PROXIES %q: want comma-separated CIDRs", f)
			}
			a = a.Unmap()
			out = append(out, netip.PrefixFrom(a, a.BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(f)
		if err != nil {
			return nil, fmt.Errorf("BERTH_TRUSTED_PROXIES %q: want comma-separated CIDRs", f)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// envBool reads a boolean environment variable: on/off, true/false, 1/0, yes/no.
func envBool(getenv func(string) string, name string, def bool) (bool, error) {
	v := strings.ToLower(strings.TrimSpace(getenv(name)))
	switch v {
	case "":
		return def, nil
	case "on", "yes":
		return true, nil
	case "off", "no":
		return false, nil
	}
	b, err := strconv.ParseBool(v)
	if err != nil {
		return def, fmt.Errorf("%s=%q: want on or off", name, v)
	}
	return b, nil
}

// minMetricsToken is the shortest BERTH_METRICS_TOKEN Berth accepts.
const minMetricsToken = 16

// newLogger logs to w at level, as text lines or, with BERTH_LOG_FORMAT=json, one JSON object
// per line.
func (c *config) newLogger(w io.Writer, level slog.Level) *slog.Logger {
	opts := &slog.HandlerOptions{Level: level}
	if c.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
