package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/jackc/pgx/v5"
)

// EventsChannel is the NOTIFY channel migration 0012's triggers send every change a page shows on.
const EventsChannel = "berth_events"

// Event is one committed change a page may show (docs/live.md): the company it belongs to, what
// changed (Topic) and which object (ID), and where it belongs, for routing to the pages that show
// it. Empty members were null in the payload.
type Event struct {
	CompanyID     string `json:"company_id"`
	Topic         string `json:"topic"`
	ID            string `json:"id"`
	TaskID        string `json:"task_id,omitempty"`
	WorkspaceID   string `json:"workspace_id,omitempty"`
	RunID         string `json:"run_id,omitempty"`
	EnvironmentID string `json:"environment_id,omitempty"`
}

// ParseEvent reads a berth_events payload; one without a company, topic or id is refused.
func ParseEvent(payload string) (Event, error) {
	var e Event
	if err := json.Unmarshal([]byte(payload), &e); err != nil {
		return Event{}, fmt.Errorf("event payload: %w", err)
	}
	if e.CompanyID == "" || e.Topic == "" || e.ID == "" {
		return Event{}, errors.New("event payload: company_id, topic and id are required")
	}
	return e, nil
}

// EventListener holds one dedicated connection (never a pool's) that LISTENs on EventsChannel
// and hands every notification to OnEvent. When the connection is lost it reconnects with
// backoff; after every LISTEN that succeeds (the first too) it calls OnListen, because
// notifications sent while nobody listened are gone and whoever shows state must re-read it.
type EventListener struct {
	Config   *pgx.ConnConfig // copied for every connection
	Log      *slog.Logger
	OnEvent  func(Event)
	OnListen func()
	// Idle is how long a wait for a notification lasts before the connection is pinged to
	// detect a dead peer (default 30 s).
	Idle time.Duration
	// MaxBackoff caps the wait between reconnection attempts (default 5 s).
	MaxBackoff time.Duration
}

// Run listens until ctx ends; it returns nil then. It never gives up on a lost connection.
func (l *EventListener) Run(ctx context.Context) error {
	if l.Config == nil || l.OnEvent == nil {
		return errors.New("event listener: config and OnEvent are required")
	}
	log := l.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	maxBackoff := l.MaxBackoff
	if maxBackoff <= 0 {
		maxBackoff = 5 * time.Second
	}
	backoff := 100 * time.Millisecond
	for ctx.Err() == nil {
		listened, err := l.listen(ctx)
		if ctx.Err() != nil {
			return nil
		}
		if listened {
			backoff = 100 * time.Millisecond
		}
		log.WarnContext(ctx, "event listener: connection lost; reconnecting", "err", err, "in", backoff.String())
		select {
		case <-ctx.Done():
			return nil
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, maxBackoff)
	}
	return nil
}

// listen opens one connection, LISTENs and delivers notifications until the connection fails;
// listened reports whether LISTEN succeeded.
func (l *EventListener) listen(ctx context.Context) (listened bool, err error) {
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, l.Config.Copy())
	cancel()
	if err != nil {
		return false, fmt.Errorf("connect: %w", err)
	}
	defer func() {
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
		defer cancel()
		_ = conn.Close(cctx)
	}()
	if _, err := conn.Exec(ctx, "LISTEN "+EventsChannel); err != nil {
		return false, fmt.Errorf("listen: %w", err)
	}
	if l.OnListen != nil {
		l.OnListen()
	}
	idle := l.Idle
	if idle <= 0 {
		idle = 30 * time.Second
	}
	for {
		wctx, cancel := context.WithTimeout(ctx, idle)
		n, err := conn.WaitForNotification(wctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return true, ctx.Err()
		case errors.Is(err, context.DeadlineExceeded) || isTimeout(err): // quiet: is the peer still there?
			pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
			err = conn.Ping(pctx)
			cancel()
			if err != nil {
				return true, fmt.Errorf("ping: %w", err)
			}
			continue
		case err != nil:
			return true, fmt.Errorf("wait: %w", err)
		}
		e, err := ParseEvent(n.Payload)
		if err != nil {
			l.logOf().WarnContext(ctx, "event listener: notification skipped", "err", err)
			continue
		}
		l.OnEvent(e)
	}
}

func (l *EventListener) logOf() *slog.Logger {
	if l.Log == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l.Log
}

// isTimeout reports whether err is a network timeout (a wait that ran out, not a failure).
func isTimeout(err error) bool {
	var t interface{ Timeout() bool }
	return errors.As(err, &t) && t.Timeout()
}

// EventCompanies lists the companies whose events a user may receive: those they are a member
// of. (Instance admins read every company; the caller checks that flag itself.)
func EventCompanies(ctx context.Context, q Querier, userID string) ([]string, error) {
	rows, err := q.Query(ctx, `SELECT company_id::text FROM memberships WHERE user_id = $1`, userID)
	if err != nil {
		return nil, fmt.Errorf("event companies: %w", err)
	}
	ids, err := pgx.CollectRows(rows, pgx.RowTo[string])
	if err != nil {
		return nil, fmt.Errorf("event companies: %w", err)
	}
	return ids, nil
}
