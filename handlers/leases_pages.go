package handlers

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"strings"
	"time"

	"berth/db"
	"berth/views"
)

// Lease pages: /leases across every company the user can read, one lease's page, and the instance
// admin's release and retry-cleanup forms.

// maxLeaseEnvCompanies bounds how many companies' environments the /leases filter offers at once;
// with more, a company must be chosen first.
const maxLeaseEnvCompanies = 20

// leasesPage is GET /leases: the leases of every company the user can read (instance admins: all),
// newest first, filtered by status, environment and company.
func (s *Server) leasesPage(w http.ResponseWriter, r *http.Request, p *principal) error {
	ctx := r.Context()
	r = s.live(r, "topic", "lease") // the results follow lease changes (events_pages.go)
	q, err := parseLeaseQuery(r)
	if err != nil {
		return err
	}
	companies, err := s.readableCompanies(ctx, p)
	if err != nil {
		return err
	}
	names := make(map[string]string, len(companies))
	for _, c := range companies {
		names[c.ID] = c.Name
	}
	// The scope: every readable company, narrowed by company_id and by the environment's company.
	// A company or environment the user cannot read leaves nothing in scope, like a missing one.
	scope := make([]string, 0, len(companies))
	for _, c := range companies {
		scope = append(scope, c.ID)
	}
	if v := strings.TrimSpace(r.URL.Query().Get("company_id")); v != "" {
		q.CompanyID = strings.ToLower(v)
		scope = slices.DeleteFunc(scope, func(id string) bool { return id != q.CompanyID })
	}
	if q.EnvironmentID != "" {
		cid, err := db.CompanyOf(ctx, s.pool, "environments", q.EnvironmentID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return err
		}
		scope = slices.DeleteFunc(scope, func(id string) bool { return id != cid })
	}
	leases, next, err := s.listLeases(ctx, scope, q)
	if err != nil {
		return err
	}

	d := views.LeasesData{Status: q.Status, EnvironmentID: q.EnvironmentID, CompanyID: q.CompanyID,
		MultiCompany: len(companies) > 1, NoCompanies: len(companies) == 0}
	for _, c := range companies {
		d.Companies = append(d.Companies, views.LeaseOption{ID: c.ID, Name: c.Name})
	}
	// Environment names: for the filter (the companies in scope, when there are few) and for the
	// rows on this page.
	envCompanies := []string{}
	if len(scope) <= maxLeaseEnvCompanies {
		envCompanies = append(envCompanies, scope...)
	} else {
		d.EnvironmentHint = "Choose a company to filter by environment."
	}
	for _, l := range leases {
		if !slices.Contains(envCompanies, l.CompanyID) {
			envCompanies = append(envCompanies, l.CompanyID)
		}
	}
	envNames := map[string]string{}
	for _, cid := range envCompanies {
		envs, err := db.EnvironmentSummaries(ctx, s.pool, cid)
		if err != nil {
			return err
		}
		inScope := len(scope) <= maxLeaseEnvCompanies && slices.Contains(scope, cid)
		for _, e := range envs {
			envNames[e.ID] = e.Name
			if inScope {
				label := e.Name
				if d.MultiCompany {
					label = names[cid] + " / " + e.Name
				}
				d.Environments = append(d.Environments, views.LeaseOption{ID: e.ID, Name: label})
			}
		}
	}
	for _, l := range leases {
		row := leaseRow(l)
		row.CompanyName, row.EnvironmentName = names[l.CompanyID], envNames[l.EnvironmentID]
		d.Rows = append(d.Rows, row)
	}
	if next != "" {
		d.NextURL = leasesPageURL(q, next)
	}
	return s.render(w, r, views.LeasesPage(s.leasesFrame(r, p, companies, q.CompanyID), d))
}

// readableCompanies lists every company the user may read, by slug: their memberships, or all
// companies for an instance admin.
func (s *Server) readableCompanies(ctx context.Context, p *principal) ([]db.VisibleCompany, error) {
	var out []db.VisibleCompany
	after := ""
	for {
		page, err := db.ListCompanies(ctx, s.pool, p.User.ID, p.User.IsInstanceAdmin, after, maxPageLimit)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
		if len(page) < maxPageLimit {
			return out, nil
		}
		after = page[len(page)-1].Slug
	}
}

// leasesPageURL is /leases with the same filters and limit, at cursor.
func leasesPageURL(q leaseQuery, cursor string) string {
	v := url.Values{}
	for k, val := range map[string]string{"status": q.Status, "environment_id": q.EnvironmentID, "company_id": q.CompanyID} {
		if val != "" {
			v.Set(k, val)
		}
	}
	if q.Limit != defaultPageLimit {
		v.Set("limit", strconv.Itoa(q.Limit))
	}
	v.Set("cursor", cursor)
	return "/leases?" + v.Encode()
}

// leaseRow phrases a lease for the pages: ages and expiry on the database clock, failure reason
// without host paths, never the provider ref.
func leaseRow(l db.Lease) views.LeaseRow {
	row := views.LeaseRow{ID: l.ID, CompanyID: l.CompanyID, EnvironmentID: l.EnvironmentID,
		ExecutionWorkspaceID: l.ExecutionWorkspaceID, TaskID: l.TaskID, RunID: l.RunID, Status: l.Status,
		Generation: l.Generation, Live: l.Live(), AcquiredAt: l.AcquiredAt, HeartbeatAt: l.HeartbeatAt,
		ExpiresAt: l.ExpiresAt, ReleasedAt: l.ReleasedAt, CreatedAt: l.CreatedAt, CleanupStatus: l.CleanupStatus,
		CleanupAttempts: l.CleanupAttempts, FailureReason: redactHostPaths(l.FailureReason)}
	if l.HeartbeatAt != nil {
		row.HeartbeatAge = humanDuration(l.HeartbeatAge()) + " ago"
	}
	if l.ExpiresAt != nil && l.Live() {
		if left := l.ExpiresAt.Sub(l.ReadAt); left >= 0 {
			row.Expiry = "in " + humanDuration(left)
		} else {
			row.Expiry, row.Overdue = "overdue by "+humanDuration(-left), true
		}
	}
	return row
}

// humanDuration is a short, coarse duration for people: "12 s", "3 min 5 s", "2 h 10 min", "4 d".
func humanDuration(d time.Duration) string {
	d = max(d, 0)
	switch s := int64(d / time.Second); {
	case s < 60:
		return fmt.Sprintf("%d s", s)
	case s < 600:
		return fmt.Sprintf("%d min %d s", s/60, s%60)
	case s < 3600:
		return fmt.Sprintf("%d min", s/60)
	case s < 48*3600:
		return fmt.Sprintf("%d h %d min", s/3600, s%3600/60)
	default:
		return fmt.Sprintf("%d d", s/86400)
	}
}

// leasePage is GET /leases/{id}: one lease with its holder, and the admin actions.
func (s *Server) leasePage(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "environment_leases", id)
	if err != nil {
		return err
	}
	return s.renderLease(w, r, a, id, http.StatusOK, "")
}

// renderLease renders a lease's page with status and an optional alert (a refused action).
func (s *Server) renderLease(w http.ResponseWriter, r *http.Request, a access, id string, status int, alert string) error {
	ctx := r.Context()
	l, err := db.LeaseByID(ctx, s.pool, a.Company.ID, id)
	if err != nil {
		return err
	}
	d := views.LeaseDetail{LeaseRow: leaseRow(l), IsAdmin: a.Admin, Alert: alert}
	d.CompanyName = a.Company.Name
	if l.EnvironmentID != "" {
		env, err := db.EnvironmentByID(ctx, s.pool, a.Company.ID, l.EnvironmentID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return err
		}
		d.EnvironmentName, d.EnvironmentDriver = env.Name, env.Driver
	}
	if l.TaskID != "" {
		task, err := db.TaskByID(ctx, s.pool, a.Company.ID, l.TaskID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return err
		}
		d.TaskKey, d.TaskTitle = task.Key, task.Title
	}
	if l.RunID != "" {
		run, err := db.RunByID(ctx, s.pool, a.Company.ID, l.RunID)
		if err != nil && !errors.Is(err, db.ErrNotFound) {
			return err
		}
		d.RunStatus = run.Status
	}
	w.Header().Set("Vary", "HX-Request")
	return s.renderStatus(w, r, status, views.LeasePage(s.companyFrame(r, a, "Lease", "leases"), d))
}

// forceReleaseLeaseForm is POST /leases/{id}/release (instance admins).
func (s *Server) forceReleaseLeaseForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "environment_leases", id)
	if err != nil {
		return err
	}
	_, err = s.forceReleaseLease(r.Context(), r, a, id)
	return s.afterLeaseAction(w, r, a, id, err)
}

// retryLeaseCleanupForm is POST /leases/{id}/retry-cleanup (instance admins).
func (s *Server) retryLeaseCleanupForm(w http.ResponseWriter, r *http.Request, p *principal) error {
	id := r.PathValue("id")
	a, err := s.objectAccess(r.Context(), p, "environment_leases", id)
	if err != nil {
		return err
	}
	_, err = s.retryLeaseCleanup(r.Context(), r, a, id)
	return s.afterLeaseAction(w, r, a, id, err)
}

// afterLeaseAction answers a lease page form: success goes back to the lease (303, or
// HX-Redirect); a refusal (409: the lease moved on meanwhile) shows the page with the reason and
// its status; other errors go to the adapter.
func (s *Server) afterLeaseAction(w http.ResponseWriter, r *http.Request, a access, id string, err error) error {
	if he, ok := formRefusal(err); ok {
		return s.renderLease(w, r, a, id, he.Status, refusalMessage(he))
	}
	if err != nil {
		return err
	}
	redirectAfterForm(w, r, "/leases/"+id)
	return nil
}
