package db

// Node claims: every working Berth process holds a shared session advisory lock on its node id
// for its whole life; the orphan sweep takes the same lock exclusively, for one transaction, to
// learn that it is the only live process of its node (docs/runs.md "Crash recovery").

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"

	"github.com/jackc/pgx/v5"
)

// LockNodeShared takes the shared claim on node for the life of conn's session, waiting while a
// sweep holds it exclusively. conn must be dedicated to the claim: closing it gives the claim back.
func LockNodeShared(ctx context.Context, conn *pgx.Conn, node string) error {
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock_shared($1)`, nodeLockKey(node)); err != nil {
		return fmt.Errorf("claim node %s: %w", node, err)
	}
	return nil
}

// TryLockNodeExclusive takes node's claim exclusively for the rest of tx, without waiting, and
// reports whether it got it: true means no other session holds a claim on node (tx's own
// session's shared claim does not count against it).
func TryLockNodeExclusive(ctx context.Context, tx pgx.Tx, node string) (bool, error) {
	var sole bool
	if err := tx.QueryRow(ctx, `SELECT pg_try_advisory_xact_lock($1)`, nodeLockKey(node)).Scan(&sole); err != nil {
		return false, fmt.Errorf("node %s exclusive claim: %w", node, err)
	}
	return sole, nil
}

// nodeLockKey is the advisory-lock key of a node id: the first 8 bytes of SHA-256 over a prefix
// that keeps it clear of Berth's other lock keys (sourceLockKey).
func nodeLockKey(node string) int64 {
	sum := sha256.Sum256([]byte("berth node claim\x00" + node))
	return int64(binary.BigEndian.Uint64(sum[:8]))
}
