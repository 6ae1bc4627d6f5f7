package handlers

import (
	"context"
	"encoding/json"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"berth/db"
	"berth/views"
)

// maxAuditFilter bounds each filter value.
const maxAuditFilter = 254

// auditQuery is a parsed audit list request: filters and one page's position.
type auditQuery struct {
	Filter db.AuditFilter
	Limit  int
	Cursor string
	After  *db.AuditCursor
}

// parseAuditQuery reads actor, action, target, limit and cursor from the query string.
func parseAuditQuery(r *http.Request) (auditQuery, error) {
	q := r.URL.Query()
	f := db.AuditFilter{
		Actor:  strings.TrimSpace(q.Get("actor")),
		Action: strings.TrimSpace(q.Get("action")),
		Target: strings.TrimSpace(q.Get("target")),
	}
	if len(f.Actor) > maxAuditFilter || len(f.Action) > maxAuditFilter || len(f.Target) > maxAuditFilter {
		return auditQuery{}, badRequest("bad_filter", "Filters are at most 254 characters.")
	}
	limit, cursor, err := pageParams(r)
	if err != nil {
		return auditQuery{}, err
	}
	out := auditQuery{Filter: f, Limit: limit, Cursor: cursor}
	if cursor != "" {
		out.After = &db.AuditCursor{}
		if err := decodeCursor(cursor, out.After); err != nil {
			return auditQuery{}, err
		}
	}
	return out, nil
}

// listAudit reads one page of the company's audit trail, newest first.
func (s *Server) listAudit(ctx context.Context, a access, q auditQuery) ([]db.AuditEvent, string, error) {
	events, err := db.ListAudit(ctx, s.pool, a.Company.ID, q.Filter, q.After, q.Limit+1)
	if err != nil {
		return nil, "", err
	}
	events, next := keysetPage(events, q.Limit, func(e db.AuditEvent) any { return db.AuditCursor{At: e.At, ID: e.ID} })
	return events, next, nil
}

// auditEventJSON is an audit event in API responses.
type auditEventJSON struct {
	ID         int64          `json:"id"`
	CompanyID  string         `json:"company_id"`
	At         time.Time      `json:"at"`
	ActorType  string         `json:"actor_type"`
	ActorID    *string        `json:"actor_id"`
	ActorLabel string         `json:"actor_label"`
	Action     string         `json:"action"`
	TargetType string         `json:"target_type"`
	TargetID   string         `json:"target_id"`
	Details    map[string]any `json:"details"`
	IP         string         `json:"ip"`
}

// auditEventResponse shapes an event for the API: a null actor id for system and anonymous
// actors, never null details.
func auditEventResponse(e db.AuditEvent) auditEventJSON {
	out := auditEventJSON{ID: e.ID, CompanyID: e.CompanyID, At: e.At.UTC(), ActorType: e.ActorType,
		ActorLabel: e.ActorLabel, Action: e.Action, TargetType: e.TargetType, TargetID: e.TargetID,
		Details: e.Details, IP: e.IP}
	if e.ActorID != "" {
		out.ActorID = &e.ActorID
	}
	if out.Details == nil {
		out.Details = map[string]any{}
	}
	return out
}

// apiListAudit is GET /api/companies/{cid}/audit-events?actor=&action=&target=&limit=&cursor=:
// any member or instance admin; newest first.
func (s *Server) apiListAudit(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	q, err := parseAuditQuery(r)
	if err != nil {
		return err
	}
	events, next, err := s.listAudit(r.Context(), a, q)
	if err != nil {
		return err
	}
	out := listResponse[auditEventJSON]{Items: make([]auditEventJSON, 0, len(events)), NextCursor: next}
	for _, e := range events {
		out.Items = append(out.Items, auditEventResponse(e))
	}
	writeJSON(w, http.StatusOK, out)
	return nil
}

// auditPage is GET /companies/{cid}/audit: the filter form and one page of events for any
// member or instance admin. htmx requests aimed at the view get the filters and results only.
func (s *Server) auditPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	a, err := s.companyAccess(r.Context(), p, r.PathValue("cid"))
	if err != nil {
		return err
	}
	q, err := parseAuditQuery(r)
	if err != nil {
		return err
	}
	events, next, err := s.listAudit(r.Context(), a, q)
	if err != nil {
		return err
	}
	d := views.AuditData{CompanyID: a.Company.ID, Actor: q.Filter.Actor, Action: q.Filter.Action, Target: q.Filter.Target}
	names, err := s.auditTargetNames(r.Context(), events) // labels.go
	if err != nil {
		return err
	}
	for _, e := range events {
		row := auditRow(e)
		row.TargetName, row.TargetHref = auditTargetLink(e, names)
		d.Events = append(d.Events, row)
	}
	if next != "" {
		d.NextURL = auditPageURL(a.Company.ID, q, next)
	}
	if htmxTarget(r, "audit-view") {
		return s.render(w, r, views.AuditView(d))
	}
	return s.render(w, r, views.AuditPage(s.companyFrame(r, a, "Audit", "audit"), d))
}

// auditRow phrases an event for the audit page; details stay JSON text, which the view escapes.
func auditRow(e db.AuditEvent) views.AuditRow {
	actor := e.ActorLabel
	if actor == "" {
		actor = e.ActorID
	}
	if actor == "" {
		actor = e.ActorType
	}
	return views.AuditRow{At: e.At, Actor: actor, ActorType: e.ActorType, Action: e.Action,
		TargetType: e.TargetType, TargetID: e.TargetID, Details: auditDetailsText(e.Details)}
}

// auditDetailsText is an event's details as compact JSON, without HTML escaping: the page
// escapes it, and people should read "<" rather than "\u003c".
func auditDetailsText(details map[string]any) string {
	if len(details) == 0 {
		return ""
	}
	var b strings.Builder
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(details); err != nil {
		return ""
	}
	return strings.TrimSuffix(b.String(), "\n")
}

// auditPageURL is the audit page with the same filters and limit, at cursor.
func auditPageURL(companyID string, q auditQuery, cursor string) string {
	v := url.Values{}
	for k, val := range map[string]string{"actor": q.Filter.Actor, "action": q.Filter.Action, "target": q.Filter.Target} {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.Limit != defaultPageLimit {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	v.Set("cursor", cursor)
	return "/companies/" + companyID + "/audit?" + v.Encode()
}
