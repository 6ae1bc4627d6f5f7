package db

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
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
	cfg := l.Config.Copy()
	cfg.DialFunc = keepAliveDial(cfg.DialFunc)
	cctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	conn, err := pgx.ConnectConfig(cctx, cfg)
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
	for {
		// No timeout and no ping: a peer that is gone closes a Unix socket, and on TCP the
		// kernel's keepalive probes (keepAliveDial) end the wait within ~30 s. An idle server's
		// database then sees nothing from this connection (docs/jobs.md "Idle").
		n, err := conn.WaitForNotification(ctx)
		switch {
		case ctx.Err() != nil:
			return true, ctx.Err()
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

// listenKeepAlive is the TCP keepalive of the listener's connection: probes after 15 s of
// silence, every 5 s, three unanswered end it (a dead peer is found in ~30 s, as the 30 s ping
// it replaces found it, without a query).
var listenKeepAlive = net.KeepAliveConfig{Enable: true, Idle: 15 * time.Second, Interval: 5 * time.Second, Count: 3}

// keepAliveDial wraps dial (pgx's dialer or a test's) so that a TCP connection it returns
// probes its peer with listenKeepAlive.
func keepAliveDial(dial pgconn.DialFunc) pgconn.DialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if tc, ok := c.(*net.TCPConn); ok && err == nil {
			if err := tc.SetKeepAliveConfig(listenKeepAlive); err != nil {
				tc.Close()
				return nil, fmt.Errorf("keepalive: %w", err)
			}
		}
		return c, err
	}
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
