package handlers

import (
	"context"
	"net/http"

	"berth/db"
	"berth/views"
)

// dashboardCompanies is how many companies the dashboard lists; the API pages through the rest.
const dashboardCompanies = 100

// dashboard is GET /: the companies the user can read (every company for an instance admin),
// counts across them, recent activity, and for instance admins the create-company form.
func (s *Server) dashboard(w http.ResponseWriter, r *http.Request, p *principal) error {
	r = s.live(r, "topic", "task,environment") // the counts follow tasks and environments (events_pages.go)
	return s.renderDashboard(w, r, p, http.StatusOK, views.CompanyForm{})
}

// renderDashboard renders the dashboard with status and the create-company form's state, so a
// refused form comes back in place.
func (s *Server) renderDashboard(w http.ResponseWriter, r *http.Request, p *principal, status int, form views.CompanyForm) error {
	d, err := s.dashboardData(r.Context(), p)
	if err != nil {
		return err
	}
	d.Form = form
	return s.renderStatus(w, r, status, views.Dashboard(s.frame(r, "Dashboard", "dashboard"), d))
}

// dashboardData loads what the dashboard shows p.
func (s *Server) dashboardData(ctx context.Context, p *principal) (views.DashboardData, error) {
	admin := p.User.IsInstanceAdmin
	cs, err := db.ListCompanies(ctx, s.pool, p.User.ID, admin, "", dashboardCompanies+1)
	if err != nil {
		return views.DashboardData{}, err
	}
	d := views.DashboardData{IsAdmin: admin, MoreCompanies: len(cs) > dashboardCompanies}
	if admin {
		if d.Onboarding, err = s.onboarding(ctx); err != nil {
			return views.DashboardData{}, err
		}
	}
	for _, c := range cs[:min(len(cs), dashboardCompanies)] {
		d.Companies = append(d.Companies, views.CompanyRow{ID: c.ID, Name: c.Name, Slug: c.Slug, Role: c.Role})
	}
	c, err := db.DashboardCounts(ctx, s.pool, p.User.ID, admin)
	if err != nil {
		return views.DashboardData{}, err
	}
	d.CompanyCount, d.Projects, d.OpenTasks, d.DoneTasks = c.Companies, c.Projects, c.OpenTasks, c.DoneTasks
	d.Environments, d.Members, d.AuditEvents = c.Environments, c.Members, c.AuditEvents
	d.QueuedJobs, d.RunningJobs, d.FailedJobs = c.QueuedJobs, c.RunningJobs, c.FailedJobs24
	events, err := db.RecentVisibleAudit(ctx, s.pool, p.User.ID, admin, 10)
	if err != nil {
		return views.DashboardData{}, err
	}
	names, err := s.auditTargetNames(ctx, events) // labels.go
	if err != nil {
		return views.DashboardData{}, err
	}
	for _, e := range events {
		actor := e.ActorLabel
		if actor == "" {
			actor = e.ActorType
		}
		row := views.ActivityRow{At: e.At, Actor: actor, Action: e.Action, Target: auditTarget(e)}
		if e.TargetType == "user" && e.TargetID != "" && e.TargetID == e.ActorID {
			row.Target = "" // "admin@… signed in", not "… signed in · user"
		}
		if name, href := auditTargetLink(e, names); href != "" {
			row.Href = href
			if name != "" {
				row.Target = name
			}
		}
		d.Activity = append(d.Activity, row)
	}
	return d, nil
}

// auditTarget phrases an event's target for people: the email or name it concerns when the
// details carry one (failed sign-ins name the email tried), else its type.
func auditTarget(e db.AuditEvent) string {
	for _, key := range []string{"email", "name"} {
		if v, ok := e.Details[key].(string); ok && v != "" {
			return v
		}
	}
	return views.TargetTypeLabel(e.TargetType)
}
