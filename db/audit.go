package db

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// Actor types recorded on audit events.
const (
	ActorUser      = "user"
	ActorAgent     = "agent"
	ActorSystem    = "system"
	ActorAnonymous = "anonymous"
)

// AuditEvent is one recorded action or denial. CompanyID is empty for instance-level events.
type AuditEvent struct {
	ID         int64
	CompanyID  string
	ActorType  string
	ActorID    string
	ActorLabel string
	Action     string
	TargetType string
	TargetID   string
	Details    map[string]any
	IP         string
	At         time.Time
}

func nullable(s string) any {
	if s == "" {
		return nil
	}
	return s
}

// InsertAudit records an event; callers pass the transaction of the change it describes.
func InsertAudit(ctx context.Context, q Querier, e AuditEvent) error {
	details := e.Details
	if details == nil {
		details = map[string]any{}
	}
	b, err := json.Marshal(details)
	if err != nil {
		return fmt.Errorf("audit %s: details: %w", e.Action, err)
	}
	_, err = q.Exec(ctx, `INSERT INTO audit_events
		(company_id, actor_type, actor_id, actor_label, action, target_type, target_id, details, ip)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)`,
		nullable(e.CompanyID), e.ActorType, nullable(e.ActorID), e.ActorLabel, e.Action,
		e.TargetType, e.TargetID, b, e.IP)
	if err != nil {
		return fmt.Errorf("audit %s: %w", e.Action, err)
	}
	return nil
}

// RecentAudit lists the newest events visible to a user: those of the given companies, plus
// instance-level events when instanceAdmin is true.
func RecentAudit(ctx context.Context, q Querier, companyIDs []string, instanceAdmin bool, limit int) ([]AuditEvent, error) {
	rows, err := q.Query(ctx, `SELECT `+auditColumns+` FROM audit_events
		WHERE company_id = ANY($1::uuid[]) OR ($2 AND company_id IS NULL)
		ORDER BY at DESC, id DESC LIMIT $3`, companyIDs, instanceAdmin, limit)
	if err != nil {
		return nil, fmt.Errorf("recent audit: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanAudit)
	if err != nil {
		return nil, fmt.Errorf("recent audit: %w", err)
	}
	return events, nil
}

// auditColumns are the columns scanAudit reads, in its order.
const auditColumns = `id, coalesce(company_id::text, ''), actor_type, coalesce(actor_id::text, ''),
	actor_label, action, target_type, target_id, details, ip, at`

// scanAudit reads auditColumns into an event.
func scanAudit(r pgx.CollectableRow) (AuditEvent, error) {
	var e AuditEvent
	err := r.Scan(&e.ID, &e.CompanyID, &e.ActorType, &e.ActorID, &e.ActorLabel, &e.Action,
		&e.TargetType, &e.TargetID, &e.Details, &e.IP, &e.At)
	return e, err
}

// RecentVisibleAudit lists the newest events a user may see on the dashboard: those of the
// companies they belong to, or of every company plus instance-level events (sign-ins, refused
// cross-site requests) when instanceAdmin is true.
func RecentVisibleAudit(ctx context.Context, q Querier, userID string, instanceAdmin bool, limit int) ([]AuditEvent, error) {
	rows, err := q.Query(ctx, `SELECT `+auditColumns+` FROM audit_events
		WHERE $2 OR company_id IN (SELECT company_id FROM memberships WHERE user_id = $1)
		ORDER BY at DESC, id DESC LIMIT $3`, userID, instanceAdmin, limit)
	if err != nil {
		return nil, fmt.Errorf("recent visible audit: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanAudit)
	if err != nil {
		return nil, fmt.Errorf("recent visible audit: %w", err)
	}
	return events, nil
}

// AuditFilter narrows a company's audit trail. Empty fields do not filter.
type AuditFilter struct {
	// Actor matches the actor's id or, ignoring case, its label (a user's email, an agent's name).
	Actor string
	// Action matches exactly, or as a prefix when it ends in "." or "*" ("project." and
	// "project.*" both match "project.created").
	Action string
	// Target matches the target's id or its type ("agent", "user"…).
	Target string
}

// AuditCursor is the position after the last event of a page, newest first.
type AuditCursor struct {
	At time.Time `json:"at"`
	ID int64     `json:"id"`
}

// ListAudit lists one company's events newest first (by time, then id), filtered by f and
// starting after the cursor when one is given.
func ListAudit(ctx context.Context, q Querier, companyID string, f AuditFilter, after *AuditCursor, limit int) ([]AuditEvent, error) {
	exact, prefix := f.Action, ""
	if p, ok := strings.CutSuffix(f.Action, "*"); ok {
		exact, prefix = "", p
	} else if strings.HasSuffix(f.Action, ".") {
		exact, prefix = "", f.Action
	}
	var afterAt *time.Time
	var afterID int64
	if after != nil {
		afterAt, afterID = &after.At, after.ID
	}
	rows, err := q.Query(ctx, `SELECT `+auditColumns+` FROM audit_events
		WHERE company_id = $1
			AND ($2 = '' OR actor_id::text = lower($2) OR lower(actor_label) = lower($2))
			AND ($3 = '' OR action = $3)
			AND ($4 = '' OR starts_with(action, $4))
			AND ($5 = '' OR target_id = $5 OR target_type = $5)
			AND ($6::timestamptz IS NULL OR (at, id) < ($6::timestamptz, $7::bigint))
		ORDER BY at DESC, id DESC LIMIT $8`,
		companyID, f.Actor, exact, prefix, f.Target, afterAt, afterID, limit)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	events, err := pgx.CollectRows(rows, scanAudit)
	if err != nil {
		return nil, fmt.Errorf("list audit: %w", err)
	}
	return events, nil
}

// UnmanagedReport is a node's latest report of what lies under its managed workspace base
// without an owner (names only).
type UnmanagedReport struct {
	Node       string
	At         time.Time
	Unmanaged  []string
	Unrecorded []string
}

// LatestUnmanagedReports returns the newest workspace.unmanaged_reported event of every node.
func LatestUnmanagedReports(ctx context.Context, q Querier) ([]UnmanagedReport, error) {
	rows, err := q.Query(ctx, `SELECT DISTINCT ON (target_id) target_id, at,
			coalesce(details->'unmanaged', '[]'), coalesce(details->'unrecorded', '[]')
		FROM audit_events WHERE company_id IS NULL AND action = 'workspace.unmanaged_reported'
		ORDER BY target_id, at DESC, id DESC`)
	if err != nil {
		return nil, fmt.Errorf("unmanaged reports: %w", err)
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (UnmanagedReport, error) {
		var u UnmanagedReport
		err := r.Scan(&u.Node, &u.At, &u.Unmanaged, &u.Unrecorded)
		return u, err
	})
}

// LatestAuditDetails returns the details (JSON) of the newest event of action on (targetType,
// targetID) recorded within the last window (database clock), or ErrNotFound: how a writer of
// periodic reports finds what it reported last.
func LatestAuditDetails(ctx context.Context, q Querier, action, targetType, targetID string, window time.Duration) ([]byte, error) {
	var b []byte
	err := q.QueryRow(ctx, `SELECT details FROM audit_events
		WHERE action = $1 AND target_type = $2 AND target_id = $3 AND at > now() - $4::interval
		ORDER BY at DESC, id DESC LIMIT 1`, action, targetType, targetID, window).Scan(&b)
	if err != nil {
		return nil, fmt.Errorf("latest %s: %w", action, notFound(err))
	}
	return b, nil
}
