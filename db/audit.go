package db

import (
	"context"
	"encoding/json"
	"fmt"
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
	rows, err := q.Query(ctx, `SELECT id, coalesce(company_id::text, ''), actor_type, coalesce(actor_id::text, ''),
			actor_label, action, target_type, target_id, details, ip, at
		FROM audit_events
		WHERE company_id = ANY($1::uuid[]) OR ($2 AND company_id IS NULL)
		ORDER BY at DESC, id DESC LIMIT $3`, companyIDs, instanceAdmin, limit)
	if err != nil {
		return nil, fmt.Errorf("recent audit: %w", err)
	}
	events, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (AuditEvent, error) {
		var e AuditEvent
		err := r.Scan(&e.ID, &e.CompanyID, &e.ActorType, &e.ActorID, &e.ActorLabel, &e.Action,
			&e.TargetType, &e.TargetID, &e.Details, &e.IP, &e.At)
		return e, err
	})
	if err != nil {
		return nil, fmt.Errorf("recent audit: %w", err)
	}
	return events, nil
}
