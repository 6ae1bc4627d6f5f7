package handlers

import (
	"bufio"
	"encoding/json"
	"errors"
	"net/http"
	"net/url"
	"strings"
	"time"

	"berth/db"
	"berth/handlers/live"
)

// Stream timing: a comment every eventsHeartbeat keeps proxies from closing an idle stream and
// lets the server notice a vanished client; every eventsRecheckBeats heartbeats the stream
// re-reads its session and memberships (an ended session or a removed membership ends it);
// after eventsMaxAge it ends and the browser reconnects (with Last-Event-ID, so nothing is
// lost), which makes it pass authentication again.
const (
	eventsHeartbeat = 25 * time.Second
	eventsMaxAge    = 30 * time.Minute
	// eventsRecheckBeats heartbeats (about 2 minutes) between re-reads of a stream's session
	// and memberships.
	eventsRecheckBeats = 5
	eventsRetryMS      = "2000"
)

// eventTopics are the topics migration 0012 sends (docs/live.md), and what a topic= filter may name.
var eventTopics = map[string]bool{"run": true, "run_log": true, "operation": true, "lease": true, "service": true,
	"workspace": true, "binding": true, "task": true, "work_product": true, "setup_session": true, "environment": true,
	"attempts": true}

// eventFilter is what one page wants of its companies' events (the /events query): every field
// given must match.
type eventFilter struct {
	company, run, task, workspace, environment, session string
	topics                                              map[string]bool
}

// parseEventFilter reads company=, run=, task=, workspace=, environment=, session= (ids) and
// topic= (a comma-separated list).
func parseEventFilter(q url.Values) (eventFilter, error) {
	var f eventFilter
	for name, dst := range map[string]*string{"company": &f.company, "run": &f.run, "task": &f.task,
		"workspace": &f.workspace, "environment": &f.environment, "session": &f.session} {
		v := q.Get(name)
		if v == "" {
			continue
		}
		if !db.ValidID(v) {
			return eventFilter{}, badRequest("bad_filter", name+" must be an id.")
		}
		*dst = strings.ToLower(v)
	}
	if t := q.Get("topic"); t != "" {
		f.topics = map[string]bool{}
		for _, name := range strings.Split(t, ",") {
			if !eventTopics[name] {
				return eventFilter{}, badRequest("bad_filter", "topic names an unknown topic.")
			}
			f.topics[name] = true
		}
	}
	return f, nil
}

// match reports whether an event passes the filter.
func (f eventFilter) match(e db.Event) bool {
	return (f.company == "" || e.CompanyID == f.company) &&
		(f.run == "" || strings.EqualFold(e.RunID, f.run)) &&
		(f.task == "" || strings.EqualFold(e.TaskID, f.task)) &&
		(f.workspace == "" || strings.EqualFold(e.WorkspaceID, f.workspace)) &&
		(f.environment == "" || strings.EqualFold(e.EnvironmentID, f.environment)) &&
		(f.session == "" || (e.Topic == "setup_session" && strings.EqualFold(e.ID, f.session))) &&
		(f.topics == nil || f.topics[e.Topic])
}

// eventsStream is GET /events: Server-Sent Events of the caller's companies' changes, filtered
// by the query (docs/live.md). Each event is named by its topic, so a page re-fetches one
// fragment per event type; "resync" asks it to re-read everything it shows once.
// Refusals are plain statuses, never the login redirect pages get: an EventSource cannot
// follow one, and a 401 or 404 makes it stop instead of retrying.
func (s *Server) eventsStream(w http.ResponseWriter, r *http.Request) error {
	ctx := r.Context()
	p := principalFrom(ctx)
	switch {
	case s.events == nil:
		return refuseStream(w, errNotFound)
	case p == nil:
		return refuseStream(w, errUnauthorized)
	case p.Run != nil:
		return refuseStream(w, errRunTokenForbidden)
	}
	f, err := parseEventFilter(r.URL.Query())
	if err != nil {
		return refuseStream(w, err)
	}
	sub := s.events.Subscribe(f.match)
	if err := s.eventMembership(r, p, f, sub); err != nil {
		return refuseStream(w, err)
	}
	cursor := r.Header.Get("Last-Event-ID")
	if cursor == "" {
		cursor = r.URL.Query().Get("after")
	}
	missed, resync := sub.Start(cursor)
	defer sub.Stop()

	// The server's read and write timeouts are for requests, not for a stream that lasts.
	rc := http.NewResponseController(w)
	_ = rc.SetReadDeadline(time.Time{})
	_ = rc.SetWriteDeadline(time.Time{})
	h := w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-store")
	h.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)

	bw := bufio.NewWriter(w)
	bw.WriteString("retry: " + eventsRetryMS + "\n\n")
	for _, he := range missed {
		writeEvent(bw, he)
	}
	if resync {
		writeEvent(bw, live.Event{Resync: true})
	}
	if err := s.flushEvents(bw, rc, sub); err != nil {
		return nil
	}

	checked := time.Now()
	beat := time.NewTicker(s.eventsBeat())
	defer beat.Stop()
	end := time.NewTimer(eventsMaxAge)
	defer end.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-end.C:
			return nil
		case he, ok := <-sub.C():
			if !ok {
				return nil // dropped for falling behind: the browser reconnects and catches up
			}
			writeEvent(bw, he)
			if err := s.flushEvents(bw, rc, sub); err != nil {
				return nil
			}
		case <-beat.C:
			if time.Since(checked) >= eventsRecheckBeats*s.eventsBeat() {
				if err := s.eventMembership(r, p, f, sub); err != nil {
					return nil // no longer allowed: end the stream; its reconnect gets the refusal
				}
				checked = time.Now()
			}
			bw.WriteString(": heartbeat\n")
			if err := s.flushEvents(bw, rc, sub); err != nil {
				return nil
			}
		}
	}
}

// flushEvents writes what is queued for the stream (events already in its channel too), then
// the stream's position as an id-only message (no event fires; a reconnect resumes there),
// and flushes.
func (s *Server) flushEvents(bw *bufio.Writer, rc *http.ResponseController, sub *live.Subscription) error {
	pos := s.events.Cursor() // every event up to pos that sub wants is in sub.C() now
	for drained := false; !drained; {
		select {
		case he, ok := <-sub.C():
			if !ok {
				return errors.New("dropped")
			}
			writeEvent(bw, he)
		default:
			drained = true
		}
	}
	bw.WriteString("id: " + pos + "\n\n")
	if err := bw.Flush(); err != nil {
		return err
	}
	return rc.Flush()
}

// writeEvent writes one event: its topic as the event name, its ids as data.
func writeEvent(bw *bufio.Writer, he live.Event) {
	if he.Resync {
		bw.WriteString("event: resync\ndata: {}\n\n")
		return
	}
	data, _ := json.Marshal(he.Change)
	bw.WriteString("event: " + he.Change.Topic + "\ndata: ")
	bw.Write(data)
	bw.WriteString("\n\n")
}

// eventMembership sets the companies whose events the caller may receive (every company for an
// instance admin); a company= filter naming one they may not see is the usual 404, and so is a
// session that has ended since the stream began.
func (s *Server) eventMembership(r *http.Request, p *principal, f eventFilter, sub *live.Subscription) error {
	ctx := r.Context()
	if p.Via == "session" {
		if _, found, err := s.sessions.Store.Find(s.sessions.Token(ctx)); err != nil || !found {
			return errUnauthorized
		}
	}
	admin := p.User.IsInstanceAdmin
	if admin {
		if u, err := db.UserByID(ctx, s.pool, p.User.ID); err == nil {
			admin = u.IsInstanceAdmin
		}
	}
	ids, err := db.EventCompanies(ctx, s.pool, p.User.ID)
	if err != nil {
		return err
	}
	if f.company != "" && !admin {
		member := false
		for _, id := range ids {
			member = member || strings.EqualFold(id, f.company)
		}
		if !member {
			return errNotFound
		}
	}
	sub.SetCompanies(ids, admin)
	return nil
}

// eventsBeat is the heartbeat interval (shorter in tests).
func (s *Server) eventsBeat() time.Duration {
	if s.eventsHeartbeat > 0 {
		return s.eventsHeartbeat
	}
	return eventsHeartbeat
}

// refuseStream answers a refused GET /events with its status and a JSON error.
func refuseStream(w http.ResponseWriter, err error) error {
	he, internal := classify(err)
	if internal {
		return err // the adapter logs it and answers 500
	}
	writeJSON(w, he.Status, map[string]any{"error": map[string]string{"code": he.Code, "message": he.Message}})
	return nil
}
