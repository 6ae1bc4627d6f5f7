package main

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"berth/db"
)

// firstAdmin is what ensureAdmin did.
type firstAdmin struct {
	created  bool
	email    string
	password string // set only when generated, to print once
}

// bootstrapLockKey serializes first-start work across processes starting together.
const bootstrapLockKey = 0x6265727468_02

// ensureAdmin creates the first instance admin when there is none: from BERTH_ADMIN_EMAIL /
// BERTH_ADMIN_PASSWORD, or admin@localhost with a generated password. An existing user with that
// email is promoted (and gets the new password).
func ensureAdmin(ctx context.Context, pool *pgxpool.Pool, c *config) (firstAdmin, error) {
	var out firstAdmin
	err := db.InTx(ctx, pool, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT pg_advisory_xact_lock($1)`, int64(bootstrapLockKey)); err != nil {
			return fmt.Errorf("first admin: lock: %w", err)
		}
		has, err := db.HasInstanceAdmin(ctx, tx)
		if err != nil || has {
			return err
		}
		out.email = db.NormalizeEmail(c.AdminEmail)
		if out.email == "" {
			out.email = "admin@localhost"
		}
		password := c.AdminPassword
		if password == "" {
			if password, err = db.RandomPassword(); err != nil {
				return err
			}
			out.password = password
		} else if len(password) < db.MinPasswordLen {
			return fmt.Errorf("BERTH_ADMIN_PASSWORD is shorter than %d characters", db.MinPasswordLen)
		}
		hash, err := db.HashPassword(password)
		if err != nil {
			return err
		}
		u, err := db.UserByEmail(ctx, tx, out.email)
		switch {
		case errors.Is(err, db.ErrNotFound):
			if u, err = db.CreateUser(ctx, tx, out.email, hash, true); err != nil {
				return err
			}
		case err != nil:
			return err
		default:
			if err := db.UpdateUserCredentials(ctx, tx, u.ID, hash, true); err != nil {
				return err
			}
		}
		out.created = true
		return db.InsertAudit(ctx, tx, db.AuditEvent{ActorType: db.ActorSystem, ActorLabel: "first start",
			Action: "user.admin_bootstrapped", TargetType: "user", TargetID: u.ID, Details: map[string]any{"email": out.email}})
	})
	if err != nil {
		return firstAdmin{}, err
	}
	return out, nil
}
