package db

import (
	"context"
	"fmt"
	"time"
)

// PreviewTicketTTL is how long a preview ticket may wait for its exchange (DESIGN §14: ≤ 60 s).
const PreviewTicketTTL = 60 * time.Second

// PreviewTicket is what a consumed ticket was minted for.
type PreviewTicket struct {
	CompanyID string
	ServiceID string
	UserID    string
}

// CreatePreviewTicket stores the hash of a new ticket for user to open service (of company),
// valid for ttl (at most PreviewTicketTTL), and deletes tickets expired long ago.
func CreatePreviewTicket(ctx context.Context, q Querier, hash []byte, t PreviewTicket, ttl time.Duration) error {
	if ttl <= 0 || ttl > PreviewTicketTTL {
		ttl = PreviewTicketTTL
	}
	if !validUUID(t.ServiceID) || !validUUID(t.UserID) || !validUUID(t.CompanyID) {
		return ErrNotFound
	}
	if _, err := q.Exec(ctx, `DELETE FROM preview_tickets WHERE expires_at < now() - interval '10 minutes'`); err != nil {
		return fmt.Errorf("prune preview tickets: %w", err)
	}
	_, err := q.Exec(ctx, `INSERT INTO preview_tickets (token_hash, company_id, service_id, user_id, expires_at)
		VALUES ($1, $2, $3, $4, now() + make_interval(secs => $5))`, hash, t.CompanyID, t.ServiceID, t.UserID, ttl.Seconds())
	if err != nil {
		return fmt.Errorf("create preview ticket: %w", err)
	}
	return nil
}

// ConsumePreviewTicket spends a ticket: only once, only before it expires (by the database
// clock); anything else is ErrNotFound.
func ConsumePreviewTicket(ctx context.Context, q Querier, hash []byte) (PreviewTicket, error) {
	var t PreviewTicket
	err := q.QueryRow(ctx, `UPDATE preview_tickets SET consumed_at = now()
		WHERE token_hash = $1 AND consumed_at IS NULL AND expires_at > now()
		RETURNING company_id, service_id, user_id`, hash).Scan(&t.CompanyID, &t.ServiceID, &t.UserID)
	if err != nil {
		return PreviewTicket{}, notFound(err)
	}
	return t, nil
}
