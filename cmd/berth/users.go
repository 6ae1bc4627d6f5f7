package main

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strings"

	"github.com/jackc/pgx/v5"

	"berth/db"
)

// userAdd creates (or with --update, updates) a user, reading the password from stdin's first
// line, and optionally gives them a role in a company.
func userAdd(ctx context.Context, args []string, getenv func(string) string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := flagSet("user add", stderr)
	c := baseConfig(fs, getenv)
	email := fs.String("email", "", "the user's email (required)")
	admin := fs.Bool("admin", false, "make the user an instance administrator")
	company := fs.String("company", "", "slug of a company to add the user to")
	role := fs.String("role", "", "role in --company: board or viewer")
	update := fs.Bool("update", false, "update the password (and grants) of an existing user instead of failing")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	addr := db.NormalizeEmail(*email)
	switch {
	case addr == "":
		return errors.New("user add: --email is required")
	case !strings.Contains(addr, "@") || len(addr) > 254 || strings.ContainsAny(addr, " \t\r\n<>\""):
		return fmt.Errorf("user add: %q is not an email address", *email)
	case (*company == "") != (*role == ""):
		return errors.New("user add: --company and --role go together")
	case *role != "" && *role != "board" && *role != "viewer":
		return fmt.Errorf("user add: --role %q: want board or viewer", *role)
	}
	password, err := readPassword(stdin)
	if err != nil {
		return err
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	hash, err := db.HashPassword(password)
	if err != nil {
		return err
	}
	log := c.newLogger(stderr, max(c.LogLevel, slog.LevelWarn)) // warnings and errors only
	d, err := openDatabase(ctx, c, log, false)
	if err != nil {
		return err
	}
	defer d.close()

	var verb string
	err = db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
		var co db.Company
		if *company != "" {
			var err error
			if co, err = db.CompanyBySlug(ctx, tx, *company); errors.Is(err, db.ErrNotFound) {
				return fmt.Errorf("user add: no company with slug %q", *company)
			} else if err != nil {
				return err
			}
		}
		u, err := db.UserByEmail(ctx, tx, addr)
		switch {
		case errors.Is(err, db.ErrNotFound):
			if u, err = db.CreateUser(ctx, tx, addr, hash, *admin); err != nil {
				return err
			}
			verb = "created"
		case err != nil:
			return err
		case !*update:
			return fmt.Errorf("user add: %s already exists (pass --update to change the password)", addr)
		default:
			if err := db.UpdateUserCredentials(ctx, tx, u.ID, hash, *admin); err != nil {
				return err
			}
			verb = "updated"
		}
		if err := db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorSystem, ActorLabel: "cli",
			Action: "user." + verb, TargetType: "user", TargetID: u.ID,
			Details: map[string]any{"email": addr, "admin": *admin}}); err != nil {
			return err
		}
		if *company != "" {
			if err := db.PutMembership(ctx, tx, co.ID, u.ID, *role); err != nil {
				return err
			}
			return db.InsertAudit(ctx, tx, db.AuditEvent{CompanyID: co.ID, ActorType: db.ActorSystem, ActorLabel: "cli",
				Action: "membership.put", TargetType: "user", TargetID: u.ID, Details: map[string]any{"email": addr, "role": *role}})
		}
		return nil
	})
	if err != nil {
		return err
	}
	fmt.Fprintf(stderr, "user %s %s\n", addr, verb)
	return nil
}

// readPassword takes the first line of r as the password.
func readPassword(r io.Reader) (string, error) {
	line, err := bufio.NewReader(io.LimitReader(r, 4096)).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return "", fmt.Errorf("read password from stdin: %w", err)
	}
	password := strings.TrimRight(line, "\r\n")
	if password == "" {
		return "", errors.New("user add: give the password on the first line of stdin (e.g. echo 'secret…' | berth user add …)")
	}
	if len(password) < db.MinPasswordLen {
		return "", fmt.Errorf("user add: the password must have at least %d characters", db.MinPasswordLen)
	}
	if len(password) > 1024 {
		return "", errors.New("user add: the password is longer than 1024 characters")
	}
	return password, nil
}

// tokenAdd prints a new API token for a user on stdout (and nothing else there).
func tokenAdd(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flagSet("token add", stderr)
	c := baseConfig(fs, getenv)
	email := fs.String("email", "", "the user's email (required)")
	name := fs.String("name", "cli", "a name to recognise the token by")
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if db.NormalizeEmail(*email) == "" {
		return errors.New("token add: --email is required")
	}
	if len(*name) > 200 {
		return errors.New("token add: --name is longer than 200 characters")
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

	token, hash, err := db.NewToken()
	if err != nil {
		return err
	}
	err = db.InTx(ctx, d.Pool, func(tx pgx.Tx) error {
		u, err := db.UserByEmail(ctx, tx, *email)
		if errors.Is(err, db.ErrNotFound) {
			return fmt.Errorf("token add: no user %s", db.NormalizeEmail(*email))
		} else if err != nil {
			return err
		}
		if u.Disabled {
			return fmt.Errorf("token add: user %s is disabled", u.Email)
		}
		t, err := db.CreateUserToken(ctx, tx, u.ID, *name, hash)
		if err != nil {
			return err
		}
		return db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorSystem, ActorLabel: "cli",
			Action: "api_token.created", TargetType: "api_token", TargetID: t.ID, Details: map[string]any{"email": u.Email, "name": *name}})
	})
	if err != nil {
		return err
	}
	fmt.Fprintln(stdout, token)
	fmt.Fprintln(stderr, "token created; it is shown only this once")
	return nil
}

// migrate applies migrations and exits.
func migrate(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	fs := flagSet("migrate", stderr)
	c := baseConfig(fs, getenv)
	if err := parseFlags(fs, args, stderr); err != nil {
		return err
	}
	if err := c.finish(getenv, ""); err != nil {
		return err
	}
	d, err := openDatabase(ctx, c, c.newLogger(stderr, c.LogLevel), false)
	if err != nil {
		return err
	}
	defer d.close()
	fmt.Fprintln(stdout, "migrations applied")
	return nil
}

// printPasswordReset tells the operator of a restarted server (whose first admin exists, so no
// login is printed) how to set a new admin password. The command runs beside the server, with the
// same BERTH_DATA_DIR or DATABASE_URL.
func printPasswordReset(w io.Writer, adminEmail string) {
	email := db.NormalizeEmail(adminEmail)
	if email == "" {
		email = "admin@localhost"
	}
	fmt.Fprintln(w, "  sign in with your admin account. Lost its password? Set a new one (same BERTH_DATA_DIR or DATABASE_URL):")
	fmt.Fprintf(w, "    echo 'a new long password' | berth user add --email %s --admin --update\n", email)
}
