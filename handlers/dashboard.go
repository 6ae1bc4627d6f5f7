package handlers

import (
	"net/http"
	"strings"

	"berth/db"
	"berth/views"
)

// dashboard shows the signed-in user's companies, counts and recent activity.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	ms, err := db.UserMemberships(ctx, s.pool, p.User.ID)
	if err != nil {
		return err
	}
	ids := make([]string, 0, len(ms))
	d := views.DashboardData{IsAdmin: p.User.IsInstanceAdmin}
	for _, m := range ms {
		ids = append(ids, m.CompanyID)
		d.Companies = append(d.Companies, views.CompanyRow{Name: m.CompanyName, Slug: m.CompanySlug, Role: m.Role})
	}
	c, err := db.DashboardCounts(ctx, s.pool, ids, p.User.IsInstanceAdmin)
	if err != nil {
		return err
	}
	d.Members, d.AuditEvents = c.Members, c.AuditEvents
	d.QueuedJobs, d.RunningJobs, d.FailedJobs = c.QueuedJobs, c.RunningJobs, c.FailedJobs24
	events, err := db.RecentAudit(ctx, s.pool, ids, p.User.IsInstanceAdmin, 10)
	if err != nil {
		return err
	}
	for _, e := range events {
		actor := e.ActorLabel
		if actor == "" {
			actor = e.ActorType
		}
		d.Activity = append(d.Activity, views.ActivityRow{At: e.At, Actor: actor, Action: strings.ReplaceAll(e.Action, ".", " "), Target: auditTarget(e)})
	}
	return s.render(w, r, views.Dashboard(s.frame(r, "Dashboard", "dashboard"), d))
}

// auditTarget phrases an event's target for people; failed sign-ins name the email tried.
func auditTarget(e db.AuditEvent) string {
	if email, ok := e.Details["email"].(string); ok && email != "" {
		return email
	}
	if e.TargetType == "" {
		return ""
	}
	return e.TargetType
}
