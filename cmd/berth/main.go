// Command berth is Berth's one binary: the web server, the job worker, migrations and the
// operator commands, all against the same database selection (DATABASE_URL, or the embedded
// default cluster in the data dir).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, os.Stderr); err != nil {
		if !errors.Is(err, flag.ErrHelp) {
			fmt.Fprintln(os.Stderr, "berth:", err)
		}
		os.Exit(1)
	}
}

const usage = `usage: berth <command> [flags]

commands:
  serve       run the web server (and the job workers unless --workers=false)
  worker      run job workers only
  migrate     apply database migrations and exit
  user add    create a user: --email E [--admin] [--company SLUG --role board|viewer] [--update]; password on stdin
  token add   print a new API token for a user: --email E [--name N]
  receipt verify FILE   check a run receipt's signature, then its digests against what still exists
  image import ENV SOURCE   turn an OCI image (layout dir or tar, docker save tarball, registry
                        reference) into the environment's next image version [--activate]
  plugin test PATH      run the driver protocol's contract suite against a plugin executable
                        [--settings JSON] [--image DIR]
  backup DIR  back the instance up into DIR (incremental): --key-out FILE or --passphrase-file FILE
  restore DIR restore a backup into an empty data dir / database: --key-file FILE or --passphrase-file FILE
              [--manifest NAME]
  doctor      check this machine (bubblewrap, namespaces, PostgreSQL, data dir, run user, …) and
              say how to fix what does not hold [--quiet: only what does not hold]
  version     print the version

configuration (environment): BERTH_ADDR, BERTH_DATA_DIR, BERTH_BASE_URL, DATABASE_URL,
BERTH_SECRET_KEY, BERTH_WORKERS, BERTH_ADMIN_EMAIL, BERTH_ADMIN_PASSWORD, BERTH_LOG_LEVEL,
BERTH_LOG_FORMAT (text or json), BERTH_NODE_ID (this process's node; default the host name),
BERTH_SOURCE_ROOTS (colon-separated directories board members may use as local sources),
BERTH_METRICS_TOKEN (a bearer token that may read /metrics),
BERTH_TRUSTED_PROXIES (comma-separated CIDRs of reverse proxies whose X-Forwarded-For is believed),
BERTH_PLUGIN_DIR (where instance admins put environment plugins; plugins are off without it),
BERTH_PLUGIN_STATE_DIR (the plugins' own files; default /var/lib/berth-plugins as root),
BERTH_COPY_MAX_BYTES (default 2GiB) and BERTH_COPY_MAX_FILES (default 200000): the largest source
a copy workspace may be made from
`

// run is main without the process: arguments, environment and streams come in, an error goes out.
func run(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	if len(args) == 0 {
		fmt.Fprint(stderr, usage)
		return errors.New("no command given")
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "serve":
		return serve(ctx, rest, getenv, stdout, stderr, true)
	case "worker":
		return serve(ctx, rest, getenv, stdout, stderr, false)
	case "migrate":
		return migrate(ctx, rest, getenv, stdout, stderr)
	case "user", "token":
		if len(rest) == 0 || rest[0] != "add" {
			return fmt.Errorf("unknown command %q: did you mean %q?", cmd+" "+first(rest), cmd+" add")
		}
		if cmd == "user" {
			return userAdd(ctx, rest[1:], getenv, stdin, stdout, stderr)
		}
		return tokenAdd(ctx, rest[1:], getenv, stdout, stderr)
	case "receipt":
		return receiptCmd(ctx, rest, getenv, stdout, stderr)
	case "plugin":
		return pluginCmd(ctx, rest, stdout, stderr)
	case "image":
		return imageCmd(ctx, rest, getenv, stdout, stderr)
	case "backup":
		return backupCmd(ctx, rest, getenv, stdout, stderr)
	case "restore":
		return restoreCmd(ctx, rest, getenv, stdout, stderr)
	case "doctor":
		return doctorCmd(ctx, rest, getenv, stdout, stderr)
	case "version", "--version", "-v":
		fmt.Fprintln(stdout, "berth", version)
		return nil
	case "help", "-h", "--help":
		fmt.Fprint(stdout, usage)
		return nil
	default:
		return fmt.Errorf("unknown command %q (run 'berth help')", cmd)
	}
}

func first(s []string) string {
	if len(s) == 0 {
		return ""
	}
	return s[0]
}
